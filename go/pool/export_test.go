package pool

// KillRoutedOnce makes the next request the pool routes find its worker dead: the worker is
// killed and its end handled (its requests failed, the process reaped) after send picked it
// and before send locks it. restore undoes it.
func KillRoutedOnce() (restore func()) {
	fired := false
	testHookRouted = func(w *proc) {
		if fired {
			return
		}
		fired = true
		w.kill()
		<-w.done
	}
	return func() { testHookRouted = nil }
}

// OnRetrying runs f before each retry's send (its wait for a worker); restore undoes it.
func OnRetrying(f func()) (restore func()) {
	testHookRetrying = f
	return func() { testHookRetrying = nil }
}
