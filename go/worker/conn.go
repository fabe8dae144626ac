package worker

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// inheritConn takes the connection of section 1: the descriptor in WIREPOOL_FD, removed from
// the environment and made close-on-exec so the worker's own children do not inherit it.
func inheritConn() (net.Conn, error) {
	s, ok := os.LookupEnv("WIREPOOL_FD")
	if !ok {
		return nil, ErrNoConnection
	}
	_ = os.Unsetenv("WIREPOOL_FD")
	fd, err := strconv.Atoi(s)
	if err != nil || fd < 0 {
		return nil, fmt.Errorf("wirepool/worker: WIREPOOL_FD=%q is not a descriptor number", s)
	}
	unix.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "wirepool")
	if f == nil {
		return nil, fmt.Errorf("wirepool/worker: WIREPOOL_FD=%d is not an open descriptor", fd)
	}
	defer f.Close() // FileConn holds a duplicate (close-on-exec too)
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("wirepool/worker: WIREPOOL_FD=%d: %w", fd, err)
	}
	return c, nil
}
