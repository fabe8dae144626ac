package proto

import "fmt"

// ProtocolError is a protocol violation found by the decoder or the connection core, or a send
// the core refuses (14.3). Code is a section 3 code; use errors.As to read it, or errors.Is
// against a *ProtocolError with the same Code (ErrTruncated, ErrUnknownID, ...).
type ProtocolError struct {
	Code    ErrorCode
	Message string
	// Field names the bad argument of an INVALID_ARGUMENT (Negotiate's offer field); else "".
	Field string
}

// Name is the code's name (section 3).
func (e *ProtocolError) Name() string { return e.Code.String() }

func (e *ProtocolError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("wirepool: %s (%d)", e.Code, uint32(e.Code))
	}
	return fmt.Sprintf("wirepool: %s (%d): %s", e.Code, uint32(e.Code), e.Message)
}

// Is reports whether target is a *ProtocolError with the same code, so that
// errors.Is(err, proto.ErrUnknownID) works whatever the message.
func (e *ProtocolError) Is(target error) bool {
	t, ok := target.(*ProtocolError)
	return ok && t.Code == e.Code
}

func errf(code ErrorCode, format string, args ...any) *ProtocolError {
	return &ProtocolError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Sentinels for errors.Is, one per code the core reports.
var (
	ErrProtocol         = &ProtocolError{Code: CodeProtocol}
	ErrTruncated        = &ProtocolError{Code: CodeTruncated}
	ErrFrameTooLarge    = &ProtocolError{Code: CodeFrameTooLarge}
	ErrUnknownFrameType = &ProtocolError{Code: CodeUnknownFrameType}
	ErrBadFlags         = &ProtocolError{Code: CodeBadFlags}
	ErrReservedNonzero  = &ProtocolError{Code: CodeReservedNonzero}
	ErrBadPayload       = &ProtocolError{Code: CodeBadPayload}
	ErrBadUTF8          = &ProtocolError{Code: CodeBadUTF8}
	ErrRowBounds        = &ProtocolError{Code: CodeRowBounds}
	ErrUnexpectedFrame  = &ProtocolError{Code: CodeUnexpectedFrame}
	ErrBadID            = &ProtocolError{Code: CodeBadID}
	ErrDuplicateID      = &ProtocolError{Code: CodeDuplicateID}
	ErrUnknownID        = &ProtocolError{Code: CodeUnknownID}
	ErrCreditOverflow   = &ProtocolError{Code: CodeCreditOverflow}
	ErrFlowControl      = &ProtocolError{Code: CodeFlowControl}
	ErrMessageTooLarge  = &ProtocolError{Code: CodeMessageTooLarge}
	ErrContinuation     = &ProtocolError{Code: CodeContinuation}
	ErrBadMagic         = &ProtocolError{Code: CodeBadMagic}
	ErrVersionMismatch  = &ProtocolError{Code: CodeVersionMismatch}
	ErrBadHandshake     = &ProtocolError{Code: CodeBadHandshake}
	ErrRowCountMismatch = &ProtocolError{Code: CodeRowCountMismatch}
	ErrKindMismatch     = &ProtocolError{Code: CodeKindMismatch}
	ErrUnknownMethod    = &ProtocolError{Code: CodeUnknownMethod}
	ErrDraining         = &ProtocolError{Code: CodeDraining}
	ErrOverloaded       = &ProtocolError{Code: CodeOverloaded}
	ErrRowTooLarge      = &ProtocolError{Code: CodeRowTooLarge}
	ErrInvalidArgument  = &ProtocolError{Code: CodeInvalidArgument}
)
