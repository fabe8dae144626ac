//! What becomes of a worker's stdout and stderr (`PoolBuilder::worker_output`): logged at WARN
//! with the worker's id and pid by default, inherited, or discarded with the stderr tail kept.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;
use wirepool::{codes, WorkerOutput};

/// A writer into a shared buffer, so the test reads what the subscriber printed.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// What the worker prints: one stdout line of ten `x` (the test worker's `print` method), two
/// stderr lines, then it exits with status 3 saying so on stderr. Returns the worker's pid and
/// the stderr tail of the exit error. The pool is shut down (and the pipes read to their end)
/// before it returns.
async fn print_then_crash(output: Option<WorkerOutput>) -> (u32, Vec<String>) {
    let mut builder = common::builder(1);
    if let Some(output) = output {
        builder = builder.worker_output(output);
    }
    let pool = builder.start().await.unwrap();
    let pid = pool.worker_pids()[0];
    let printed: usize = pool.call("print", &(10usize, 2usize)).await.unwrap();
    assert_eq!(printed, 10);
    let err = pool.call::<_, ()>("crash", &3i32).await.unwrap_err();
    assert_eq!(err.code(), codes::WORKER_EXITED, "{err}");
    let tail = err.exit_info().unwrap().stderr_tail.clone();
    pool.shutdown().await;
    (pid, tail)
}

/// Runs `print_then_crash` under a subscriber that shows WARN and above, as a user's default
/// filter would; returns what it printed, the pid and the stderr tail.
fn logged_at_warn(output: Option<WorkerOutput>) -> (String, u32, Vec<String>) {
    let out = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_env_filter("warn")
        .with_ansi(false)
        .finish();
    // The subscriber is this thread's; a current-thread runtime keeps every task (the pipe
    // readers too) on it.
    let (pid, tail) = tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(common::bounded(60, print_then_crash(output)))
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    (text, pid, tail)
}

#[test]
fn by_default_both_streams_are_logged_at_warn_with_worker_and_pid() {
    let (text, pid, tail) = logged_at_warn(None);
    // The worker's own lines carry `stream`; the pool's report of the exit does not.
    let worker_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("wirepool::worker") && l.contains(" stream="))
        .collect();
    let find = |needle: &str| {
        worker_lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no log line with {needle:?} in:\n{text}"))
            .to_string()
    };
    for (needle, stream) in [
        ("xxxxxxxxxx", "stdout"),
        ("stderr line 1", "stderr"),
        ("about to crash with status 3", "stderr"),
    ] {
        let line = find(needle);
        assert!(line.contains(" WARN "), "{line}");
        assert!(line.contains(&format!("pid={pid}")), "{line}");
        assert!(line.contains("worker="), "{line}");
        assert!(line.contains(&format!("stream=\"{stream}\"")), "{line}");
    }
    assert!(
        tail.iter().any(|l| l == "about to crash with status 3"),
        "{tail:?}"
    );
}

#[test]
fn discard_logs_nothing_and_keeps_the_stderr_tail() {
    let (text, _, tail) = logged_at_warn(Some(WorkerOutput::Discard));
    // The pool's own report of the exit is there, no line of the worker's.
    assert!(text.contains("exited with status 3"), "{text}");
    assert!(!text.contains(" stream="), "{text}");
    assert!(!text.contains("xxxxxxxxxx"), "{text}");
    assert_eq!(
        tail,
        [
            "stderr line 0",
            "stderr line 1",
            "about to crash with status 3"
        ],
    );
}

/// Set in the child process `inherit_gives_the_worker_the_parents_own_streams` starts.
const INHERIT_CHILD: &str = "WIREPOOL_TEST_INHERIT_CHILD";

#[test]
fn inherit_gives_the_worker_the_parents_own_streams() {
    if std::env::var_os(INHERIT_CHILD).is_some() {
        // The child: its stdout and stderr are pipes the test below reads.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (_, tail) = rt.block_on(common::bounded(
            60,
            print_then_crash(Some(WorkerOutput::Inherit)),
        ));
        println!("stderr tail in the parent: {tail:?}");
        return;
    }
    // This test again, in a process of its own whose streams the test owns (the harness's
    // capture covers `print!`, not what another process writes to descriptor 1).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = rt.block_on(async {
        let child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "inherit_gives_the_worker_the_parents_own_streams",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(INHERIT_CHILD, "1")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        tokio::time::timeout(Duration::from_secs(90), child)
            .await
            .expect("the child test exceeded its time bound")
            .unwrap()
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The harness prints the test's name on the same line: the worker's line follows it.
    assert!(stdout.contains("xxxxxxxxxx\n"), "{stdout}");
    for line in ["stderr line 1", "about to crash with status 3"] {
        assert!(
            stderr.lines().any(|l| l == line),
            "{line:?} not in:\n{stderr}"
        );
    }
    // The parent read none of it.
    assert!(stdout.contains("stderr tail in the parent: []"), "{stdout}");
}
