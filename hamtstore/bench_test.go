package hamtstore

import (
	"fmt"
	"testing"
)

// Benchmarks over MemNodeStore. Besides time they report the domain counters:
// "reads/op" (store GetNode calls, cold Reader per op) and "nodes/op" (nodes
// written per Set).
func BenchmarkGetCold(b *testing.B) {
	for _, size := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			store := NewMemNodeStore()
			root := buildMap(b, store, size)
			b.ResetTimer()
			reads := 0
			for i := 0; b.Loop(); i++ {
				r := NewReader(store)
				if _, ok, err := r.Get(root, fmt.Appendf(nil, "key %d", i%size)); err != nil || !ok {
					b.Fatal(ok, err)
				}
				reads += r.NodesRead()
			}
			b.ReportMetric(float64(reads)/float64(b.N), "reads/op")
		})
	}
}

func BenchmarkSet(b *testing.B) {
	for _, size := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			store := NewMemNodeStore()
			root := buildMap(b, store, size)
			r := NewReader(store)
			store.ResetCounters()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				var err error
				root, err = Set(store, r, root, fmt.Appendf(nil, "key %d", i%size), Value{byte(i), byte(i >> 8), 1})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(store.Puts())/float64(b.N), "nodes/op")
		})
	}
}
