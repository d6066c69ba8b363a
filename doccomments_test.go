package mtxdb

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestExportedHaveDocs parses every non-test Go file of the repository, in every
// module (parseRepoGoFiles), and fails naming each exported top-level identifier
// without a doc comment: functions, methods of exported types, types, constants and
// variables. A comment over a parenthesized const or var group documents its
// members; a type in a group needs its own.
func TestExportedHaveDocs(t *testing.T) {
	fset, files := parseRepoGoFiles(t)
	undocumented := 0
	for _, f := range files {
		for _, u := range undocumentedExports(f.file) {
			undocumented++
			t.Errorf("%s:%d: exported %s has no doc comment", f.path, fset.Position(u.node.Pos()).Line, u.name)
		}
	}
	t.Logf("%d files, %d exported identifiers without a doc comment", len(files), undocumented)
}

// goFile is one parsed Go file of the repository and its path from the root.
type goFile struct {
	path string
	file *ast.File
}

// parseRepoGoFiles parses, with comments, every non-test Go file of the
// repository in every module: directories starting with "." (.git, build trees,
// work directories), testdata and vendor are left out. It fails the test when
// fewer than 100 files are found: a test started outside the repository's root
// would pass by reading nothing.
func parseRepoGoFiles(t *testing.T) (*token.FileSet, []goFile) {
	t.Helper()
	fset := token.NewFileSet()
	var files []goFile
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files = append(files, goFile{path, f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 100 {
		t.Fatalf("read %d non-test Go files; the repository has over 100: is the working directory its root?", len(files))
	}
	return fset, files
}

// undocumentedExports returns the file's exported top-level identifiers that have
// no doc comment, in file order. A method counts when both it and its receiver's
// type are exported.
func undocumentedExports(f *ast.File) []namedFunc {
	var out []namedFunc
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv == nil || len(d.Recv.List) == 0 {
				out = append(out, namedFunc{"func " + d.Name.Name, d})
				continue
			}
			if recv := receiverName(d.Recv.List[0].Type); ast.IsExported(recv) {
				out = append(out, namedFunc{"method " + recv + "." + d.Name.Name, d})
			}
		case *ast.GenDecl:
			out = append(out, undocumentedSpecs(d)...)
		}
	}
	return out
}

// undocumentedSpecs returns the exported types, constants and variables of one
// declaration that have no doc comment. A declaration of one unparenthesized spec
// is documented by the comment over it; a parenthesized const or var group by the
// comment over the group or over the spec; a type in a group only by its own.
func undocumentedSpecs(d *ast.GenDecl) []namedFunc {
	grouped := d.Lparen.IsValid()
	var out []namedFunc
	for _, s := range d.Specs {
		switch s := s.(type) {
		case *ast.TypeSpec:
			if s.Name.IsExported() && s.Doc == nil && (grouped || d.Doc == nil) {
				out = append(out, namedFunc{"type " + s.Name.Name, s})
			}
		case *ast.ValueSpec:
			if s.Doc != nil || d.Doc != nil {
				continue
			}
			for _, n := range s.Names {
				if n.IsExported() {
					out = append(out, namedFunc{d.Tok.String() + " " + n.Name, n})
				}
			}
		}
	}
	return out
}
