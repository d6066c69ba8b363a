package hamtstore

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
)

// Small assertion helpers: the module's tests use no assertion library.

func msg(args []any) string {
	if len(args) == 0 {
		return ""
	}
	if f, ok := args[0].(string); ok {
		return ": " + fmt.Sprintf(f, args[1:]...)
	}
	return ": " + fmt.Sprint(args...)
}

func noErr(t testing.TB, err error, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error%s: %v", msg(args), err)
	}
}

func errIs(t testing.TB, err, target error, args ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v is not %v%s", err, target, msg(args))
	}
}

func equal(t testing.TB, want, got any, args ...any) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Fatalf("not equal%s:\nwant %v\ngot  %v", msg(args), show(want), show(got))
	}
}

func isTrue(t testing.TB, cond bool, args ...any) {
	t.Helper()
	if !cond {
		t.Fatalf("condition false%s", msg(args))
	}
}

// show prints maps of *Value readably.
func show(v any) string {
	switch m := v.(type) {
	case map[string]diffRec:
		s := "{"
		for k, d := range m {
			s += fmt.Sprintf("%q: (%v -> %v) ", k, pv(d.old), pv(d.new))
		}
		return s + "}"
	case map[string][]*Value:
		s := "{"
		for k, vs := range m {
			s += fmt.Sprintf("%q: [", k)
			for _, x := range vs {
				s += pv(x) + " "
			}
			s += "] "
		}
		return s + "}"
	}
	return fmt.Sprintf("%v", v)
}

func pv(v *Value) string {
	if v == nil {
		return "nil"
	}
	return fmt.Sprintf("%x", v[:])
}
