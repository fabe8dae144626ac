package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
)

// clampText is what a clamp notice says (PROTOCOL.md 4.2, conformance/README.md clamp_notices).
const clampText = "is above the worker's max_concurrency"

// notices is a slog.Handler that counts the pool's clamp notices and prints every record on
// stderr (the runner's stdout is its report channel).
type notices struct {
	clamps *atomic.Int64
	out    slog.Handler
}

func newNotices() notices {
	return notices{clamps: new(atomic.Int64), out: slog.NewTextHandler(os.Stderr, nil)}
}

func (n notices) Enabled(ctx context.Context, l slog.Level) bool { return true }

func (n notices) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && strings.Contains(r.Message, clampText) {
		n.clamps.Add(1)
	}
	return n.out.Handle(ctx, r)
}

func (n notices) WithAttrs(a []slog.Attr) slog.Handler {
	return notices{n.clamps, n.out.WithAttrs(a)}
}

func (n notices) WithGroup(g string) slog.Handler { return notices{n.clamps, n.out.WithGroup(g)} }

// checkClampNotices: the pool said the clamp exactly clamp_notices times, when the scenario
// expects a number.
func (x *scenario) checkClampNotices() error {
	want, ok := x.expect()["clamp_notices"]
	if !ok {
		return nil
	}
	if got := x.notices.clamps.Load(); got != int64(integer(want)) {
		return failf("the pool logged %d clamp notice(s) (max_in_flight above the worker's max_concurrency), expected %v", got, want)
	}
	return nil
}
