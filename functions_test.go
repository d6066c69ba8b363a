package mtxdb

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFunctionLines is the longest a function of the repository's non-test Go code
// may be, counted from its func line to its closing brace: past it, a function
// is a sequence of phases waiting to be named.
const maxFunctionLines = 120

// TestFunctionLength parses every non-test Go file of the repository, in every
// module (directories starting with "." left out: .git, build trees, work
// directories), and fails naming each function over maxFunctionLines lines:
// declared functions and methods, and function literals assigned at package
// level. Test files are exempt.
func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	files, long := 0, 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, fn := range functions(f) {
			start, end := fset.Position(fn.node.Pos()), fset.Position(fn.node.End())
			if n := end.Line - start.Line + 1; n > maxFunctionLines {
				long++
				t.Errorf("%s:%d: %s is %d lines, over %d: split it into named phases", path, start.Line, fn.name, n, maxFunctionLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk must have found the repository's code: a test started elsewhere
	// would pass by reading nothing.
	if files < 100 {
		t.Fatalf("read %d non-test Go files; the repository has over 100: is the working directory its root?", files)
	}
	t.Logf("%d files, %d functions over %d lines", files, long, maxFunctionLines)
}

// namedFunc is a function of a file and the name the failure gives it.
type namedFunc struct {
	name string
	node ast.Node
}

// functions returns the file's declared functions and methods (methods as
// Type.Method) and the function literals its package-level variables hold.
func functions(f *ast.File) []namedFunc {
	var out []namedFunc
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			name := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) > 0 {
				name = receiverName(d.Recv.List[0].Type) + "." + name
			}
			out = append(out, namedFunc{name, d})
		case *ast.GenDecl:
			for _, s := range d.Specs {
				vs, ok := s.(*ast.ValueSpec)
				if !ok {
					continue
				}
				for i, v := range vs.Values {
					if lit, ok := v.(*ast.FuncLit); ok && i < len(vs.Names) {
						out = append(out, namedFunc{fmt.Sprintf("var %s", vs.Names[i].Name), lit})
					}
				}
			}
		}
	}
	return out
}

// receiverName is the type name of a method's receiver, without pointer or type
// parameters.
func receiverName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiverName(t.X)
	case *ast.IndexExpr:
		return receiverName(t.X)
	case *ast.IndexListExpr:
		return receiverName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return fmt.Sprintf("%T", e)
}
