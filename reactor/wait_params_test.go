package reactor

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/corral-dev/corral/api"
)

// TestOutputLimitNamesTheNegativeField: a negative offset or limit of
// exec.output is refused naming that field first, so the -32602 carries it
// in error.data.field.
func TestOutputLimitNamesTheNegativeField(t *testing.T) {
	for _, tt := range []struct {
		p    api.OutputParams
		want string
	}{
		{api.OutputParams{Offset: -1}, "offset: "},
		{api.OutputParams{Limit: -1}, "limit: "},
	} {
		_, err := outputLimit(tt.p)
		if api.ErrorCode(err) != api.CodeInvalidParams || err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("outputLimit(%+v) = %v, want -32602 starting %q", tt.p, err, tt.want)
		}
	}
}

// TestFollowNamesTheNegativeField: a negative offset or heartbeat of
// exec.follow is refused naming that one field first, so the -32602 carries
// it in error.data.field.
func TestFollowNamesTheNegativeField(t *testing.T) {
	for _, tt := range []struct {
		p    api.FollowParams
		want string
	}{
		{api.FollowParams{ID: "x", StdoutOffset: -1}, "stdout_offset: "},
		{api.FollowParams{ID: "x", StderrOffset: -1}, "stderr_offset: "},
		{api.FollowParams{ID: "x", HeartbeatMS: -1}, "heartbeat_ms: "},
	} {
		err := checkFollowParams(tt.p)
		if api.ErrorCode(err) != api.CodeInvalidParams || err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("checkFollowParams(%+v) = %v, want -32602 starting %q", tt.p, err, tt.want)
		}
	}
	if err := checkFollowParams(api.FollowParams{ID: "x", StdoutOffset: 1, HeartbeatMS: 5}); err != nil {
		t.Errorf("checkFollowParams of valid params = %v", err)
	}
}

// TestEveryInvalidParamsNamesOneField walks every api.Errorf(api.CodeInvalidParams,
// ...) in the reactor's source: its format must start with one field and ": "
// (a literal name, or %s for a name passed in), as ipc's leadingField reads it
// into error.data.field, which docs/protocol.md says every -32602 carries.
func TestEveryInvalidParamsNamesOneField(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	field := regexp.MustCompile(`^([a-z_][a-z0-9_.]*|%s): `)
	fset := token.NewFileSet()
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "Errorf" {
				return true
			}
			if code, ok := call.Args[0].(*ast.SelectorExpr); !ok || code.Sel.Name != "CodeInvalidParams" {
				return true
			}
			n++
			lit, ok := call.Args[1].(*ast.BasicLit)
			if !ok {
				t.Errorf("%s: a -32602 whose format is not a literal", fset.Position(call.Pos()))
				return true
			}
			format, _ := strconv.Unquote(lit.Value)
			if !field.MatchString(format) {
				t.Errorf("%s: -32602 %q does not start with one field and \": \"", fset.Position(call.Pos()), format)
			}
			return true
		})
	}
	if n < 20 {
		t.Errorf("found %d -32602 errors in the reactor's source, want the 20 or more it has", n)
	}
}
