//go:build !linux

package worker

// parentDeathSignal: no such signal outside Linux; end of file on the connection is the notice
// (8.4).
func parentDeathSignal() (stop func()) { return func() {} }
