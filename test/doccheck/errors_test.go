package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestErrorTableMatchesCode: the protocol's one error table ("Error codes")
// lists exactly the API error codes the router packages define, each with
// the HTTP status the code gives it. The codes are the string constants
// named Code* under router/; the statuses come from the function that
// switches over them (statusOf today), read from the source, so the test
// follows the code wherever the wire-contract package keeps it.
func TestErrorTableMatchesCode(t *testing.T) {
	code := codeStatuses(t, filepath.Join(repoRoot, "router"))
	doc := docErrorTable(t, readDoc(t, "docs/protocol.md"))
	for c, st := range code {
		got, ok := doc[c]
		switch {
		case !ok:
			t.Errorf("error code %q (status %d) is defined in the code but missing from the Error codes table", c, st)
		case got != st:
			t.Errorf("error code %q: the table says status %d, the code gives %d", c, got, st)
		}
	}
	for c := range doc {
		if _, ok := code[c]; !ok {
			t.Errorf("the Error codes table lists %q, which the code does not define", c)
		}
	}
}

// tableRow matches a row of the error table: | `code` | status | ...
var tableRow = regexp.MustCompile("^\\| `([a-z_]+)` \\| (\\d{3}) \\|")

// docErrorTable returns code -> status from the "### Error codes" section.
func docErrorTable(t *testing.T, text string) map[string]int {
	t.Helper()
	start := strings.Index(text, "\n### Error codes\n")
	if start < 0 {
		t.Fatal(`docs/protocol.md has no "### Error codes" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section[4:], "\n#"); end >= 0 {
		section = section[:end+4]
	}
	out := map[string]int{}
	for _, line := range strings.Split(section, "\n") {
		if m := tableRow.FindStringSubmatch(line); m != nil {
			if _, dup := out[m[1]]; dup {
				t.Errorf("the Error codes table lists %q twice", m[1])
			}
			out[m[1]], _ = strconv.Atoi(m[2])
		}
	}
	if len(out) == 0 {
		t.Fatal("the Error codes section has no table rows")
	}
	return out
}

// httpStatus are the net/http constants a status mapping may use.
var httpStatus = map[string]int{
	"StatusOK": 200, "StatusBadRequest": 400, "StatusUnauthorized": 401, "StatusForbidden": 403,
	"StatusNotFound": 404, "StatusMethodNotAllowed": 405, "StatusConflict": 409,
	"StatusRequestEntityTooLarge": 413, "StatusUnprocessableEntity": 422, "StatusTooManyRequests": 429,
	"StatusInternalServerError": 500, "StatusServiceUnavailable": 503, "StatusGatewayTimeout": 504,
}

// codeStatuses parses the non-test Go files under dir and returns code ->
// status: the string constants Code* = "..." and the function whose switch
// cases name them (its trailing return is the status of every other code).
func codeStatuses(t *testing.T, dir string) map[string]int {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]string{} // constant name -> code
	ints := map[string]int{}     // integer constant name -> value (StatusOverloaded = 529)
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok || len(vs.Names) != len(vs.Values) {
				return true
			}
			for i, name := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok {
					continue
				}
				switch {
				case lit.Kind == token.STRING && strings.HasPrefix(name.Name, "Code"):
					codes[name.Name], _ = strconv.Unquote(lit.Value)
				case lit.Kind == token.INT:
					ints[name.Name], _ = strconv.Atoi(lit.Value)
				}
			}
			return true
		})
	}
	if len(codes) == 0 {
		t.Fatalf("no Code* string constants under %s: where did the error codes go?", dir)
	}
	status := func(e ast.Expr) (int, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			v, err := strconv.Atoi(e.Value)
			return v, err == nil
		case *ast.SelectorExpr:
			v, ok := httpStatus[e.Sel.Name]
			return v, ok
		case *ast.Ident:
			v, ok := ints[e.Name]
			return v, ok
		}
		return 0, false
	}
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			out, ok := statusSwitch(fn.Body, codes, status)
			if !ok {
				continue
			}
			for name, c := range codes {
				if _, ok := out[c]; !ok {
					st, ok := out[""]
					if !ok {
						t.Fatalf("%s: code %s has no status and the function has no trailing return", fn.Name.Name, name)
					}
					out[c] = st
				}
			}
			delete(out, "")
			return out
		}
	}
	t.Fatalf("no function under %s maps the Code* constants to statuses in a switch", dir)
	return nil
}

// statusSwitch reads a function body of the form
//
//	switch x { case CodeA, CodeB: return <status> ... }; return <status>
//
// into code -> status ("" for the trailing return). ok is false for any
// other function.
func statusSwitch(body *ast.BlockStmt, codes map[string]string, status func(ast.Expr) (int, bool)) (map[string]int, bool) {
	out := map[string]int{}
	for _, st := range body.List {
		switch st := st.(type) {
		case *ast.SwitchStmt:
			for _, cc := range st.Body.List {
				clause := cc.(*ast.CaseClause)
				if len(clause.Body) != 1 {
					continue
				}
				ret, ok := clause.Body[0].(*ast.ReturnStmt)
				if !ok || len(ret.Results) != 1 {
					continue
				}
				v, ok := status(ret.Results[0])
				if !ok {
					continue
				}
				for _, e := range clause.List {
					if id, ok := e.(*ast.Ident); ok {
						if c, ok := codes[id.Name]; ok {
							out[c] = v
						}
					}
				}
			}
		case *ast.ReturnStmt:
			if len(st.Results) == 1 {
				if v, ok := status(st.Results[0]); ok {
					out[""] = v
				}
			}
		}
	}
	named := 0
	for c := range out {
		if c != "" {
			named++
		}
	}
	// A status mapping names most codes; a function that happens to switch
	// over one or two is something else.
	return out, named >= len(codes)/2 && slices.Contains(keys(out), "")
}

func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
