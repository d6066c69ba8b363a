package mtxdb

import (
	"fmt"
	"go/ast"
	"testing"
)

// maxFunctionLines is the longest a function of the repository's non-test Go code
// may be, counted from its func line to its closing brace: past it, a function
// is a sequence of phases waiting to be named.
const maxFunctionLines = 120

// TestFunctionLength parses every non-test Go file of the repository, in every
// module (parseRepoGoFiles), and fails naming each function over
// maxFunctionLines lines: declared functions and methods, and function literals
// assigned at package level. Test files are exempt.
func TestFunctionLength(t *testing.T) {
	fset, files := parseRepoGoFiles(t)
	long := 0
	for _, f := range files {
		for _, fn := range functions(f.file) {
			start, end := fset.Position(fn.node.Pos()), fset.Position(fn.node.End())
			if n := end.Line - start.Line + 1; n > maxFunctionLines {
				long++
				t.Errorf("%s:%d: %s is %d lines, over %d: split it into named phases", f.path, start.Line, fn.name, n, maxFunctionLines)
			}
		}
	}
	t.Logf("%d files, %d functions over %d lines", len(files), long, maxFunctionLines)
}

// namedFunc is a declaration of a file (a function, or for TestExportedHaveDocs a
// type, constant or variable) and the name a failure gives it.
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
