//! Starting a worker process: socketpair, inherited descriptor (or a join ticket), own process
//! group, no shell.
//! Also the continuous capture of its stdout and stderr ([`WorkerOutput`]), and RSS reading.

use crate::lock::Locked;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::error::Error;
use crate::remote::Transport;

/// The command that starts one worker: program, arguments, environment, working directory.
///
/// The program is executed directly (never through a shell). Each worker runs in its own process
/// group, so killing it also kills whatever it started.
///
/// ```
/// use wirepool::WorkerCommand;
/// let cmd = WorkerCommand::new("python3").arg("-m").arg("my_worker").env("RUST_LOG", "info");
/// assert_eq!(cmd.program(), "python3");
/// ```
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    env_clear: bool,
    cwd: Option<PathBuf>,
}

impl WorkerCommand {
    /// A command that runs `program` (looked up in `PATH` if it has no slash).
    pub fn new(program: impl Into<OsString>) -> Self {
        WorkerCommand {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            env_clear: false,
            cwd: None,
        }
    }
    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }
    /// Appends several arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }
    /// Sets one environment variable for the worker.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
    /// Starts the worker with an empty environment (plus what [`env`](Self::env) sets).
    pub fn env_clear(mut self) -> Self {
        self.env_clear = true;
        self
    }
    /// Sets the worker's working directory.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }
    /// The program, as given.
    pub fn program(&self) -> &str {
        self.program.to_str().unwrap_or("<non-utf8>")
    }
}

/// What becomes of a worker's stdout and stderr; set with
/// [`PoolBuilder::worker_output`](crate::PoolBuilder::worker_output), which has an example.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerOutput {
    /// Each line of either stream becomes a `tracing` event at WARN (target `wirepool::worker`,
    /// fields `worker`, `pid`, `stream`), so a worker's prints show under a subscriber's usual
    /// level. Lines longer than 4 KiB are cut. The default.
    #[default]
    Log,
    /// The worker writes straight to the parent's own stdout and stderr (unprefixed, interleaved
    /// with the parent's output). The parent then sees none of it: errors carry no stderr tail.
    Inherit,
    /// Both streams are read and dropped; the stderr tail is still kept for errors.
    Discard,
}

/// A freshly started worker process, before the handshake.
pub(crate) struct Spawned {
    pub child: Child,
    pub pid: u32,
    /// The parent's end of the socketpair (`None` for a child that joins with a ticket).
    pub transport: Option<Transport>,
    pub stderr_tail: Arc<StderrTail>,
    /// Completes when both stdout and stderr reached end of file.
    pub logs_done: tokio::task::JoinHandle<()>,
}

/// What the pool holds of a worker's process: the local child it signals and reaps, or, for a
/// remote worker, at most the child it started for it (PROTOCOL.md 21.6: a remote worker's end
/// is its connection's; such a child is stopped after a grace and reaped in the background).
pub(crate) enum Process {
    Local(Child),
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    Remote {
        child: Option<Child>,
        /// How long a child whose connection ended has to exit by itself before it is killed.
        stop_grace: std::time::Duration,
    },
}

impl Process {
    /// A local child's exit; never completes for a remote worker.
    pub(crate) async fn wait_local(&mut self) -> Option<std::process::ExitStatus> {
        match self {
            Process::Local(child) => child.wait().await.ok(),
            Process::Remote { .. } => std::future::pending().await,
        }
    }

    /// A remote worker's child (if any) gets its grace to exit by itself, then is killed with
    /// its group; either way it is reaped when this returns.
    pub(crate) async fn release_remote(self) {
        if let Process::Remote {
            child: Some(mut child),
            stop_grace,
        } = self
        {
            let pid = child.id().unwrap_or(0);
            let status = match tokio::time::timeout(stop_grace, child.wait()).await {
                Ok(status) => status.ok(),
                Err(_) => {
                    signal_group(pid, libc::SIGKILL);
                    child.wait().await.ok()
                }
            };
            tracing::debug!(pid, ?status, "a remote worker's child exited");
        }
    }
}

/// 4 MiB socket buffers let 1 MiB frames flow without the sender stalling on every frame
/// (measured ~6 GB/s -> 7+ GB/s on the socketpair floor); the kernel caps it at wmem_max.
const SOCKET_BUFFER_BYTES: libc::c_int = 4 << 20;

pub(crate) fn set_socket_buffers(fd: libc::c_int) {
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: fd is a valid socket owned by the caller; the option value is a c_int.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &SOCKET_BUFFER_BYTES as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

fn spawn_failed(cmd: &WorkerCommand) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::SpawnFailed {
        program: cmd.program().to_string(),
        source: Arc::new(e),
    }
}

/// The worker's command as every launcher on this machine runs it: directly, in its own
/// process group, stdin closed, stdout and stderr as `output` says.
fn command(cmd: &WorkerCommand, worker_id: u32, output: WorkerOutput) -> Command {
    let mut command = Command::new(&cmd.program);
    if cmd.env_clear {
        command.env_clear();
    }
    command
        .args(&cmd.args)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .env("WIREPOOL_WORKER_ID", worker_id.to_string())
        .stdin(Stdio::null())
        .stdout(stdio(output))
        .stderr(stdio(output))
        .kill_on_drop(true)
        .process_group(0);
    if let Some(dir) = &cmd.cwd {
        command.current_dir(dir);
    }
    command
}

pub(crate) fn spawn_worker(
    cmd: &WorkerCommand,
    worker_id: u32,
    stderr_lines: usize,
    output: WorkerOutput,
) -> Result<Spawned, Error> {
    let fail = spawn_failed(cmd);
    // std creates both ends with SOCK_CLOEXEC, so no other child spawned concurrently (by us or
    // by another thread) inherits either end; only this child gets its end, via pre_exec below.
    let (parent_end, worker_end) = std::os::unix::net::UnixStream::pair().map_err(&fail)?;
    set_socket_buffers(parent_end.as_raw_fd());
    set_socket_buffers(worker_end.as_raw_fd());
    let worker_fd = worker_end.as_raw_fd();

    let mut command = command(cmd, worker_id, output);
    command.env("WIREPOOL_FD", worker_fd.to_string());
    // SAFETY: the closure runs between fork and exec and only calls fcntl, which is
    // async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            // Clear FD_CLOEXEC on the worker's end so exactly this child inherits it.
            if libc::fcntl(worker_fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(&fail)?;
    // The parent closes its copy of the worker's end right after spawning (PROTOCOL.md 1), so
    // the worker's death is seen as end of file.
    drop(worker_end);
    parent_end.set_nonblocking(true).map_err(&fail)?;
    let transport = Transport::socket(parent_end.into()).map_err(&fail)?;
    Ok(with_output(
        child,
        Some(transport),
        worker_id,
        stderr_lines,
        output,
    ))
}

/// A child that joins the pool's listener with `ticket` (the text form) instead of inheriting
/// a socket: `WIREPOOL_TICKET` set, `WIREPOOL_FD` and `WIREPOOL_TICKET_FILE` removed
/// (PROTOCOL.md 21.2).
#[cfg(feature = "remote")]
pub(crate) fn spawn_joining(
    cmd: &WorkerCommand,
    worker_id: u32,
    ticket: &str,
    stderr_lines: usize,
    output: WorkerOutput,
) -> Result<Spawned, Error> {
    let mut command = command(cmd, worker_id, output);
    command
        .env_remove("WIREPOOL_FD")
        .env_remove("WIREPOOL_TICKET_FILE")
        .env("WIREPOOL_TICKET", ticket);
    let child = command.spawn().map_err(spawn_failed(cmd))?;
    Ok(with_output(child, None, worker_id, stderr_lines, output))
}

/// Starts reading the child's stdout and stderr (see [`WorkerOutput`]).
fn with_output(
    mut child: Child,
    transport: Option<Transport>,
    worker_id: u32,
    stderr_lines: usize,
    output: WorkerOutput,
) -> Spawned {
    let pid = child.id().unwrap_or(0);
    let tail = Arc::new(StderrTail::new(stderr_lines));
    let log = output == WorkerOutput::Log;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let out_task = stdout.map(|pipe| pump_lines(pipe, worker_id, pid, "stdout", log, None));
    let err_task =
        stderr.map(|pipe| pump_lines(pipe, worker_id, pid, "stderr", log, Some(tail.clone())));
    // Inherited streams leave nothing to read: the task ends at once.
    let logs_done = tokio::spawn(async move {
        let out = async {
            if let Some(t) = out_task {
                t.await
            }
        };
        let err = async {
            if let Some(t) = err_task {
                t.await
            }
        };
        tokio::join!(out, err);
    });
    Spawned {
        child,
        pid,
        transport,
        stderr_tail: tail,
        logs_done,
    }
}

fn stdio(output: WorkerOutput) -> Stdio {
    match output {
        WorkerOutput::Inherit => Stdio::inherit(),
        WorkerOutput::Log | WorkerOutput::Discard => Stdio::piped(),
    }
}

/// A bounded ring of the last lines a worker wrote to stderr.
pub(crate) struct StderrTail {
    cap: usize,
    lines: Mutex<VecDeque<String>>,
}

impl StderrTail {
    pub(crate) fn new(cap: usize) -> Self {
        StderrTail {
            cap,
            lines: Mutex::new(VecDeque::with_capacity(cap.min(64))),
        }
    }
    fn push(&self, line: String) {
        if self.cap == 0 {
            return;
        }
        let mut lines = self.lines.locked();
        if lines.len() == self.cap {
            lines.pop_front();
        }
        lines.push_back(line);
    }
    pub fn snapshot(&self) -> Vec<String> {
        self.lines.locked().iter().cloned().collect()
    }
}

/// Longest line kept for logs; a worker printing one 100 MB line costs one truncated log line.
const MAX_LINE: usize = 4096;

/// Reads a worker's stdout or stderr until end of file, forwarding each line to `tracing` (if
/// `log`) and to the stderr tail (if any). It never stops reading, so a chatty worker can never
/// block on a full pipe.
async fn pump_lines(
    mut pipe: impl tokio::io::AsyncRead + Unpin,
    worker_id: u32,
    pid: u32,
    stream: &'static str,
    log: bool,
    tail: Option<Arc<StderrTail>>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    if !log && tail.is_none() {
        // Discarded stdout: no line is wanted, so none is split.
        while let Ok(1..) = pipe.read(&mut buf).await {}
        return;
    }
    let mut line: Vec<u8> = Vec::with_capacity(256);
    let mut truncated = false;
    let emit = |line: &mut Vec<u8>, truncated: &mut bool| {
        let mut text = String::from_utf8_lossy(line).into_owned();
        if *truncated {
            text.push_str(" [...truncated]");
        }
        // WARN for stdout too: at INFO a worker's prints vanished under the usual filters.
        if log {
            tracing::warn!(target: "wirepool::worker", worker = worker_id, pid, stream, "{text}");
        }
        if let Some(t) = &tail {
            t.push(text);
        }
        line.clear();
        *truncated = false;
    };
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            match memchr_newline(rest) {
                Some(i) => {
                    take_bounded(&mut line, &rest[..i], &mut truncated);
                    emit(&mut line, &mut truncated);
                    rest = &rest[i + 1..];
                }
                None => {
                    take_bounded(&mut line, rest, &mut truncated);
                    rest = &[];
                }
            }
        }
    }
    if !line.is_empty() {
        emit(&mut line, &mut truncated);
    }
}

fn take_bounded(line: &mut Vec<u8>, chunk: &[u8], truncated: &mut bool) {
    let room = MAX_LINE.saturating_sub(line.len());
    if chunk.len() > room {
        *truncated = true;
    }
    line.extend_from_slice(&chunk[..chunk.len().min(room)]);
}

fn memchr_newline(s: &[u8]) -> Option<usize> {
    s.iter().position(|&b| b == b'\n')
}

/// Resident set size of a process, in bytes (from `/proc/<pid>/statm`).
pub(crate) fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

/// Peak resident set size (`VmHWM`) of a process, in bytes; `None` once it is gone.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let path = if pid == 0 {
        "/proc/self/status".to_string()
    } else {
        format!("/proc/{pid}/status")
    };
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

/// Sends `signal` to the worker's whole process group. Callers only do this before the worker
/// was reaped, so the group id cannot have been reused.
pub(crate) fn signal_group(pid: u32, signal: libc::c_int) {
    if pid > 1 {
        // SAFETY: plain syscall; a stale group yields ESRCH, which is harmless.
        unsafe {
            libc::kill(-(pid as libc::pid_t), signal);
        }
    }
}
