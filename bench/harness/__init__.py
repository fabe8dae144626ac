"""The wirepool benchmark harness: scenarios, runner execution, analysis, report, history."""
