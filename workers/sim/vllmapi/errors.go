package vllmapi

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Error is an error reply in vLLM's OpenAI shape:
//
//	{"error": {"message": "...", "type": "BadRequestError", "param": null, "code": 400}}
//
// Code is the HTTP status, as vLLM sends it.
type Error struct {
	Status  int
	Type    string
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

func badRequest(format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "BadRequestError", Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Type: "NotFoundError", Message: fmt.Sprintf(format, args...)}
}

func unavailable(format string, args ...any) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailableError", Message: fmt.Sprintf(format, args...)}
}

func internal(format string, args ...any) *Error {
	return &Error{Status: http.StatusInternalServerError, Type: "InternalServerError", Message: fmt.Sprintf(format, args...)}
}

type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func (e *Error) body() errorBody {
	return errorBody{Error: errorInfo{Message: e.Message, Type: e.Type, Code: e.Status}}
}

// writeError sends e as the whole reply.
func writeError(w http.ResponseWriter, e *Error) {
	writeJSON(w, e.Status, e.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
