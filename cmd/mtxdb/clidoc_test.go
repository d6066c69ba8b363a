package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// updateDocs makes TestCLIDoc write docs/cli.md instead of comparing it (make docs).
var updateDocs = flag.Bool("update-docs", false, "write docs/cli.md from the command tree instead of comparing it")

// cliDocPath is docs/cli.md from this package's directory.
var cliDocPath = filepath.Join("..", "..", "docs", "cli.md")

// TestCLIDoc fails when docs/cli.md is not what writeCLIDoc makes of the command
// tree today: a command, flag or help text changed without `make docs`.
func TestCLIDoc(t *testing.T) {
	var b bytes.Buffer
	writeCLIDoc(&b, rootCmd())
	if *updateDocs {
		if err := os.WriteFile(cliDocPath, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	have, err := os.ReadFile(cliDocPath)
	if err != nil {
		t.Fatalf("%v (make docs writes it)", err)
	}
	if !bytes.Equal(have, b.Bytes()) {
		hl, wl := strings.Split(string(have), "\n"), strings.Split(b.String(), "\n")
		i := 0
		for i < len(hl) && i < len(wl) && hl[i] == wl[i] {
			i++
		}
		line := func(ls []string) string {
			if i < len(ls) {
				return ls[i]
			}
			return "(end of file)"
		}
		t.Fatalf("docs/cli.md is stale: run make docs. First difference, line %d:\n have: %s\n want: %s", i+1, line(hl), line(wl))
	}
}

// TestCLIDocCoversEveryCommand checks the generator itself: every command of the
// tree has its section, and every flag of each command its line.
func TestCLIDocCoversEveryCommand(t *testing.T) {
	root := rootCmd()
	var b bytes.Buffer
	writeCLIDoc(&b, root)
	doc := b.String()
	n := 0
	for _, c := range docCommands(root) {
		n++
		if !strings.Contains(doc, "\n## "+c.CommandPath()+"\n") {
			t.Errorf("no section for %q", c.CommandPath())
		}
		c.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
			if !strings.Contains(doc, "- `--"+f.Name) {
				t.Errorf("%s: no line for --%s", c.CommandPath(), f.Name)
			}
		})
	}
	if n < 10 {
		t.Errorf("%d commands documented, want the 11 of the tree", n)
	}
}

// docCommands lists the commands under root that a user runs, depth first in
// the tree's order (cobra sorts subcommands by name).
func docCommands(root *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, c := range root.Commands() {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		out = append(out, c)
		out = append(out, docCommands(c)...)
	}
	return out
}

// writeCLIDoc writes the Markdown reference of the command tree: the global
// flags, then per command its summary, usage line, help text and flags.
func writeCLIDoc(b *bytes.Buffer, root *cobra.Command) {
	b.WriteString("# The mtxdb command line\n\n")
	b.WriteString("Generated from the command tree (`cmd/mtxdb`) by `make docs`; `go test ./cmd/mtxdb`\n")
	b.WriteString("fails when this page is stale. `mtxdb COMMAND --help` prints the same text.\n\n")
	b.WriteString(root.Short + ".\n\n")
	cmds := docCommands(root)
	for _, c := range cmds {
		fmt.Fprintf(b, "- [`%s`](#%s): %s\n", c.CommandPath(), anchor(c.CommandPath()), c.Short)
	}
	b.WriteString("\nGlobal flags (every command takes them):\n\n")
	writeFlags(b, root.PersistentFlags())
	for _, c := range cmds {
		fmt.Fprintf(b, "\n## %s\n\n%s.\n\n", c.CommandPath(), c.Short)
		fmt.Fprintf(b, "```\n%s\n```\n\n", c.UseLine())
		if long := strings.TrimSpace(c.Long); long != "" {
			fmt.Fprintf(b, "```text\n%s\n```\n\n", long)
		}
		flags := c.NonInheritedFlags()
		if flags.HasAvailableFlags() {
			b.WriteString("Flags:\n\n")
			writeFlags(b, flags)
		}
	}
}

// writeFlags writes one list item per flag: name, value placeholder, usage and
// default (when it is not the type's zero value).
func writeFlags(b *bytes.Buffer, fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		name, usage := pflag.UnquoteUsage(f)
		head := "--" + f.Name
		if f.Shorthand != "" {
			head = "-" + f.Shorthand + ", " + head
		}
		if name != "" && f.Value.Type() != "bool" {
			head += " " + name
		}
		usage = strings.Join(strings.Fields(usage), " ")
		switch f.DefValue {
		case "", "0", "false", "[]", "0s":
		default:
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(b, "- `%s`: %s\n", head, usage)
	})
}

// anchor is GitHub's heading anchor for a heading of plain words and dashes.
func anchor(heading string) string {
	return strings.ReplaceAll(strings.ToLower(heading), " ", "-")
}
