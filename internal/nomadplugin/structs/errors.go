package structs

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	structspb "github.com/oasis-llm/oasis/internal/nomadplugin/proto/structs"
)

// RecoverableError is an error that says whether the call that failed may
// be retried: Nomad's client restarts a task whose start failed
// recoverably (within the job's restart policy) and fails it otherwise.
type RecoverableError struct {
	Err         error
	Recoverable bool
}

// NewRecoverableError wraps err; nil stays nil.
func NewRecoverableError(err error, recoverable bool) error {
	if err == nil {
		return nil
	}
	return &RecoverableError{Err: err, Recoverable: recoverable}
}

func (e *RecoverableError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *RecoverableError) Unwrap() error { return e.Err }

// IsRecoverable reports whether err says its call may be retried.
func IsRecoverable(err error) bool {
	var re *RecoverableError
	return errors.As(err, &re) && re.Recoverable
}

// GRPCStatusError turns a RecoverableError into the gRPC status Nomad's
// client reads (FailedPrecondition with a RecoverableError detail); other
// errors are returned as they are.
func GRPCStatusError(err error) error {
	var re *RecoverableError
	if !errors.As(err, &re) {
		return err
	}
	st, detErr := status.New(codes.FailedPrecondition, err.Error()).
		WithDetails(&structspb.RecoverableError{Recoverable: re.Recoverable})
	if detErr != nil {
		return err
	}
	return st.Err()
}

// ErrorFromGRPC is the reverse of GRPCStatusError, for Oasis's own clients
// of a plugin (tests, gpu-check).
func ErrorFromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, d := range st.Details() {
		if re, ok := d.(*structspb.RecoverableError); ok {
			return NewRecoverableError(errors.New(st.Message()), re.GetRecoverable())
		}
	}
	return err
}
