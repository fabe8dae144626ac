package worker

import (
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// parentDeathSignal asks for SIGKILL when the parent dies (8.4). The setting belongs to the
// thread that asks, so it is asked on a locked OS thread kept alive until stop is called (the
// worker then exits). The race of a parent that died before the prctl: getppid is read as the
// package initialises and again after the prctl, and a change kills the worker at once. A parent that died even before the
// first getppid is caught by end of file on the connection.
// initialPpid is the parent's pid as the process starts, before any prctl.
var initialPpid = unix.Getppid()

func parentDeathSignal() (stop func()) {
	ready := make(chan struct{})
	quit := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread ends with this goroutine, when the worker is leaving.
		_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0)
		if unix.Getppid() != initialPpid {
			_ = unix.Kill(unix.Getpid(), unix.SIGKILL)
		}
		close(ready)
		<-quit
	}()
	<-ready
	return func() { close(quit) }
}
