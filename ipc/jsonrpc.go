package ipc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/corral-dev/corral/api"
)

// version is the only JSON-RPC version corral speaks.
const version = "2.0"

// nullID is the id of a response to a message whose id could not be read.
var nullID = json.RawMessage("null")

// request is one JSON-RPC request or notification as read off the wire. The
// fields are raw so that the validation in parseRequest can tell "absent"
// from "wrong type" and answer with the right code.
type request struct {
	JSONRPC json.RawMessage `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// call is a validated request.
type call struct {
	id     json.RawMessage // nil for a notification
	method string
	params json.RawMessage // nil when absent or null
}

// notification reports whether the caller expects no response.
func (c *call) notification() bool { return c.id == nil }

// wireError is the error member of a response.
type wireError struct {
	Code    api.Code `json:"code"`
	Message string   `json:"message"`
	Data    any      `json:"data,omitempty"`
}

// errorData is the data member of an invalid-params error (an extension:
// the field the message names, as a JSON path below params).
type errorData struct {
	Field string `json:"field,omitempty"`
}

type successResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
}

type errorResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   wireError       `json:"error"`
}

type notificationMsg struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  any    `json:"params"`
}

// rpcError is an error the transport itself answers (codes -32700..-32602);
// field is set for invalid params.
type rpcError struct {
	code  api.Code
	msg   string
	field string
}

func (e *rpcError) Error() string { return e.msg }

// encodeError renders an error response. It cannot fail.
func encodeError(id json.RawMessage, e wireError) []byte {
	if id == nil {
		id = nullID
	}
	b, err := json.Marshal(errorResponse{JSONRPC: version, ID: id, Error: e})
	if err != nil {
		// Only Data could fail to marshal; drop it.
		e.Data = nil
		b, _ = json.Marshal(errorResponse{JSONRPC: version, ID: id, Error: e})
	}
	return b
}

// encodeResult renders a success response: the bytes
// json.Marshal(successResponse{...}) gives, with the result encoded once.
// (Marshalling the response around the encoded result as a RawMessage would
// scan and copy the result a second time to compact it, which json.Marshal's
// output already is.)
//
// A result that is a json.RawMessage is taken as encoded by encoding/json
// already (compact, HTML-escaped: exec.start's and exec.wait's record as
// the store encoded it, EncodedStarter and EncodedWaiter) and copied as it
// is.
func encodeResult(id json.RawMessage, result any) ([]byte, error) {
	r, ok := result.(json.RawMessage)
	if !ok || len(r) == 0 {
		var err error
		if r, err = json.Marshal(result); err != nil {
			return nil, fmt.Errorf("marshal result: %w", err)
		}
	}
	if id == nil {
		id = nullID // what json.Marshal writes for a nil RawMessage
	}
	// The id as read off the wire: compacted and HTML-escaped as
	// json.Marshal does with a RawMessage (it is a few bytes).
	idb, err := json.Marshal(id)
	if err != nil {
		return nil, fmt.Errorf("marshal id: %w", err)
	}
	const head, mid, tail = `{"jsonrpc":"` + version + `","id":`, `,"result":`, `}`
	// One byte more: the caller appends the line's '\n' (encodeLine).
	b := make([]byte, 0, len(head)+len(idb)+len(mid)+len(r)+len(tail)+1)
	b = append(b, head...)
	b = append(b, idb...)
	b = append(b, mid...)
	b = append(b, r...)
	return append(b, tail...), nil
}

// encodeNote renders a notification as one line ('\n' included): the bytes
// json.Marshal(notificationMsg{...}) gives. params that are a
// json.RawMessage are taken as encoded by encoding/json already (compact,
// HTML-escaped: what the reactor's exec.state notifications carry, the
// record as the store encoded it) and copied as they are, not scanned again.
func encodeNote(method string, params any) ([]byte, error) {
	raw, ok := params.(json.RawMessage)
	if !ok || len(raw) == 0 {
		b, err := json.Marshal(notificationMsg{JSONRPC: version, Method: method, Params: params})
		if err != nil {
			return nil, err
		}
		return encodeLine(b), nil
	}
	mb, err := json.Marshal(method)
	if err != nil {
		return nil, err
	}
	const head, mid, tail = `{"jsonrpc":"` + version + `","method":`, `,"params":`, "}\n"
	b := make([]byte, 0, len(head)+len(mb)+len(mid)+len(raw)+len(tail))
	b = append(b, head...)
	b = append(b, mb...)
	b = append(b, mid...)
	b = append(b, raw...)
	return append(b, tail...), nil
}

// firstByte returns the first non-whitespace byte of b, or 0.
func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// parseRequest validates one request object. On failure it returns the id to
// answer with (the request's own when it was readable, else null) and the
// error.
func parseRequest(raw json.RawMessage) (*call, json.RawMessage, *rpcError) {
	if firstByte(raw) != '{' {
		return nil, nullID, &rpcError{code: api.CodeInvalidRequest, msg: "invalid request: want a JSON object"}
	}
	var r request
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, nullID, &rpcError{code: api.CodeInvalidRequest, msg: "invalid request: " + err.Error()}
	}
	c := &call{}
	answerID := nullID
	if r.ID != nil {
		switch firstByte(r.ID) {
		case '"', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			c.id = r.ID
			answerID = r.ID
		default:
			return nil, nullID, &rpcError{code: api.CodeInvalidRequest, msg: "invalid request: id must be a string, number or null"}
		}
	}
	var v string
	if r.JSONRPC == nil || json.Unmarshal(r.JSONRPC, &v) != nil || v != version {
		return nil, answerID, &rpcError{code: api.CodeInvalidRequest, msg: `invalid request: jsonrpc must be "2.0"`}
	}
	if r.Method == nil || json.Unmarshal(r.Method, &c.method) != nil {
		return nil, answerID, &rpcError{code: api.CodeInvalidRequest, msg: "invalid request: method must be a string"}
	}
	switch firstByte(r.Params) {
	case 0, 'n':
		// absent or null: the zero params
	case '{':
		c.params = r.Params
	default:
		return c, answerID, &rpcError{code: api.CodeInvalidParams, field: "params", msg: "params: want object"}
	}
	return c, answerID, nil
}

// decodeParams decodes params into v. Errors name the offending field as
// "params.<path>". bytesField names v's base64 field, if any, so that a bad
// encoding can be reported against it (encoding/json does not say which).
func decodeParams(params json.RawMessage, v any, bytesField string) error {
	if params == nil {
		return nil
	}
	err := json.Unmarshal(params, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	var b64 base64.CorruptInputError
	switch {
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			return &rpcError{code: api.CodeInvalidParams, field: "params", msg: "params: want " + jsonKind(te.Type)}
		}
		want := jsonKind(te.Type)
		if ft := fieldType(v, field); ft != nil && ft.Kind() == reflect.Map && ft != te.Type {
			// encoding/json names the map, not the key, for a bad value.
			want = jsonKind(ft)
		}
		return &rpcError{code: api.CodeInvalidParams, field: field,
			msg: fmt.Sprintf("params.%s: want %s", field, want)}
	case errors.As(err, &b64) && bytesField != "":
		return &rpcError{code: api.CodeInvalidParams, field: bytesField,
			msg: fmt.Sprintf("params.%s: want base64 string", bytesField)}
	default:
		// A custom unmarshaler (api.State, ...) or a syntax error: say what
		// json says, it usually names the value.
		return &rpcError{code: api.CodeInvalidParams, field: "params", msg: "params: " + err.Error()}
	}
}

// fieldType returns the type of the top-level field of *v whose JSON name is
// name, or nil.
func fieldType(v any, name string) reflect.Type {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return nil
	}
	t = t.Elem()
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == name || (tag == "" && strings.EqualFold(f.Name, name)) {
			return f.Type
		}
	}
	return nil
}

// jsonKind names the JSON type that decodes into t.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "other type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "base64 string"
		}
		return "array"
	case reflect.Map, reflect.Struct:
		if t.Kind() == reflect.Map && t.Elem().Kind() == reflect.String {
			return "object of strings"
		}
		return "object"
	}
	return t.String()
}
