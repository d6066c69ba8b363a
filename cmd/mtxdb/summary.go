package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// kv is one field of a summary line: printed as key=value, or as a JSON member.
type kv struct {
	k string
	v any
}

// printLine prints one line of a command's output: "what: k=v k=v ..." or, with
// asJSON, one JSON object {"kind": what, "k": v, ...} with the fields in order.
// Every summary line goes through it, so --json gives the same fields as the text.
func printLine(out io.Writer, asJSON bool, what string, fields ...kv) {
	if !asJSON {
		var b bytes.Buffer
		b.WriteString(what)
		b.WriteByte(':')
		for _, f := range fields {
			fmt.Fprintf(&b, " %s=%v", f.k, f.v)
		}
		b.WriteByte('\n')
		_, _ = out.Write(b.Bytes())
		return
	}
	out.Write(jsonLine(what, fields))
}

// jsonLine encodes {"kind": what, fields...} and a newline.
func jsonLine(what string, fields []kv) []byte {
	var b bytes.Buffer
	k, _ := json.Marshal(what)
	b.WriteString(`{"kind":`)
	b.Write(k)
	for _, f := range fields {
		name, _ := json.Marshal(f.k)
		v, err := json.Marshal(f.v)
		if err != nil {
			v, _ = json.Marshal(fmt.Sprint(f.v))
		}
		b.WriteByte(',')
		b.Write(name)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteString("}\n")
	return b.Bytes()
}

// jsonFlag registers --json on a command that prints summary lines.
func jsonFlag(c *cobra.Command, v *bool) {
	c.Flags().BoolVar(v, "json", false, `print every line of output as a JSON object ({"kind": ..., fields...}), one per line`)
}
