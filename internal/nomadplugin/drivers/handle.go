package drivers

import "github.com/oasis-llm/oasis/internal/nomadplugin/base"

// TaskHandle is what a driver returns from StartTask: the client stores it
// and hands it to RecoverTask after a restart. DriverState is the driver's
// own msgpack-encoded state.
type TaskHandle struct {
	Version     int
	Config      *TaskConfig
	State       TaskState
	DriverState []byte
}

// NewTaskHandle returns a handle whose driver state has the given version.
func NewTaskHandle(version int) *TaskHandle {
	return &TaskHandle{Version: version}
}

// SetDriverState msgpack-encodes v (a struct with `codec` tags) into the
// handle.
func (h *TaskHandle) SetDriverState(v any) error {
	h.DriverState = nil
	return base.MsgPackEncode(&h.DriverState, v)
}

// GetDriverState decodes the handle's driver state into v.
func (h *TaskHandle) GetDriverState(v any) error {
	return base.MsgPackDecode(h.DriverState, v)
}
