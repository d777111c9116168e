package reactor

import (
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
