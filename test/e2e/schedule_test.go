package e2e

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// e2eParallel is how many of this package's tests run at once when the
// command line does not say (-parallel). Its tests wait, on real servers'
// start-ups, on caa's timers and on polls, far more than they compute: one
// at a time they kept 2 cores at a load of about 0.8. Four at a time fill
// the 2 cores CI has without a test's waits stretching past its bounds
// (docs/test-times.md has the figures).
const e2eParallel = 4

// defaultParallel sets -test.parallel to e2eParallel unless the command
// line set it. TestMain calls it after flag.Parse, before m.Run reads it.
func defaultParallel() {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(e2eParallel))
	}
}

// serial marks a test that must not share the machine with this package's
// other tests, and says why (a latency it asserts, say). It is a test's
// first statement, where TestEveryTestDeclaresItsSchedule looks for it; the
// reason shows in -v output.
func serial(t *testing.T, reason string) {
	t.Helper()
	t.Logf("runs alone in this package: %s", reason)
}

// TestEveryTestDeclaresItsSchedule: every top-level test in this package
// starts with t.Parallel() or with serial(t, "<why>"), so that a new test
// chooses, and a serial one says why. Most tests here wait rather than
// compute; run one after another they made this package most of make
// test's time (issue 44).
func TestEveryTestDeclaresItsSchedule(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			seen++
			if why := scheduleOf(fn); why != "" {
				t.Errorf("%s: %s %s: start it with t.Parallel() when it waits (the usual case here), "+
					"or with serial(t, \"<why>\") when it asserts a latency or needs the machine to itself",
					fset.Position(fn.Pos()), fn.Name.Name, why)
			}
		}
	}
	if seen == 0 {
		t.Fatal("found no tests: the check reads the package's own directory")
	}
}

// scheduleOf is "" when test fn's first statement is t.Parallel() or
// serial(t, "<a reason>"), else what is wrong.
func scheduleOf(fn *ast.FuncDecl) string {
	if fn.Body == nil || len(fn.Body.List) == 0 {
		return "is empty"
	}
	expr, ok := fn.Body.List[0].(*ast.ExprStmt)
	if !ok {
		return "does not declare its schedule"
	}
	call, ok := expr.X.(*ast.CallExpr)
	if !ok {
		return "does not declare its schedule"
	}
	switch f := call.Fun.(type) {
	case *ast.SelectorExpr:
		if f.Sel.Name == "Parallel" && len(call.Args) == 0 {
			return ""
		}
	case *ast.Ident:
		if f.Name == "serial" && len(call.Args) == 2 {
			if lit, ok := call.Args[1].(*ast.BasicLit); ok && lit.Kind == token.STRING && len(strings.Trim(lit.Value, "\"` ")) > 0 {
				return ""
			}
			return "is serial without a reason (a string literal)"
		}
	}
	return "does not declare its schedule"
}
