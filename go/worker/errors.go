package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/wirepool/wirepool/go/proto"
)

// Error codes a handler may return (section 3); any code of 1000 and above is the
// application's own.
const (
	CodeBadRequest       = uint32(proto.CodeBadRequest)
	CodeHandlerError     = uint32(proto.CodeHandlerError)
	CodeHandlerPanic     = uint32(proto.CodeHandlerPanic)
	CodeCancelled        = uint32(proto.CodeCancelled)
	CodeDeadlineExceeded = uint32(proto.CodeDeadlineExceeded)
	CodeRowTooLarge      = uint32(proto.CodeRowTooLarge)
)

// Error is a request's error as the parent receives it: Code (HANDLER_ERROR when 0), Message,
// and Details, sent as JSON (json.RawMessage as it is, anything else through encoding/json).
// Any other error a handler returns ends its request HANDLER_ERROR with err.Error() as the
// message; a panic ends it HANDLER_PANIC.
type Error struct {
	Code    uint32
	Message string
	Details any
}

func (e Error) Error() string {
	if e.Code == 0 {
		return e.Message
	}
	return fmt.Sprintf("%s (code %d)", e.Message, e.Code)
}

// Errorf returns an Error with code and a formatted message.
func Errorf(code uint32, format string, args ...any) Error {
	return Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// wireError is an outcome turned into an ERROR's fields.
type wireError struct {
	code    proto.ErrorCode
	message string
	details string
}

func toWire(err error) wireError {
	var e Error
	var pe *Error
	switch {
	case errors.As(err, &e):
	case errors.As(err, &pe) && pe != nil:
		e = *pe
	default:
		return wireError{code: proto.CodeHandlerError, message: err.Error()}
	}
	w := wireError{code: proto.ErrorCode(e.Code), message: e.Message}
	if w.code == 0 {
		w.code = proto.CodeHandlerError
	}
	switch d := e.Details.(type) {
	case nil:
	case json.RawMessage:
		w.details = string(d)
	default:
		b, err := json.Marshal(d)
		if err != nil {
			w.message += fmt.Sprintf(" (its details could not be encoded as JSON: %v)", err)
		} else {
			w.details = string(b)
		}
	}
	return w
}

// causeError is the Error a handler's context carries once its flag is set.
func causeError(code proto.ErrorCode) error {
	if code == proto.CodeDeadlineExceeded {
		return Error{Code: uint32(code), Message: "the request's deadline passed"}
	}
	return Error{Code: uint32(code), Message: "the request was cancelled"}
}

// ctxError is what Rows.Send returns once ctx is done.
func ctxError(ctx context.Context) error {
	if c := context.Cause(ctx); c != nil {
		return c
	}
	return ctx.Err()
}
