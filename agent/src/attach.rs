//! `GET /attach/{namespace}/{name}` (WebSocket): a terminal or a command inside one of
//! this node's running allocations, for `lattice attach` through the API server.
//!
//! The bearer token is a single-use ticket the API server wrote; the agent redeems it
//! (`POST /v1/attach/redeem` with its own credentials) and runs exactly what it grants:
//! the command (or the owner's login shell) as the allocation's user — the account the
//! run's own checks allow ([`crate::policy`]) — with the run's environment (`LATTICE_*`,
//! `SLURM_*`, the allocation's `spec.env`) and working directory, in its cgroups, in a
//! session of its own, on a pseudo-terminal when asked. As for the run itself, the
//! environment is applied by the exec after the drop to the user, never to a root
//! process. The session ends when the client
//! leaves (SIGHUP to its process group, SIGKILL shortly after), when the command exits,
//! or when the allocation's run on this node ends. The framing is described in
//! [`lattice_apis::attach`].

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{self, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lattice_apis::attach::{self as proto, AttachStatus, AttachTicket, TerminalSize};
use lattice_apis::Allocation;
use lattice_runtime::Api;
use nix::libc;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::sync::mpsc;

use crate::agent::Ctx;
use crate::runtime::RunAs;
use crate::state::TaskRecord;
use crate::supervisor::{workload_cwd, workload_env};

/// How often a session checks that the allocation still runs here.
const RUN_CHECK: Duration = Duration::from_secs(1);
/// SIGHUP, then this long before SIGKILL.
const HANGUP_GRACE: Duration = Duration::from_secs(2);

fn refuse(code: StatusCode, msg: impl Into<String>) -> Response {
    let msg = msg.into();
    tracing::info!(code = code.as_u16(), %msg, "attach refused");
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "message": msg }).to_string(),
    )
        .into_response()
}

/// The handler.
pub async fn attach(
    State(ctx): State<Option<Arc<Ctx>>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(params): Query<Vec<(String, String)>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let Some(ctx) = ctx else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "this agent does not serve attach",
        );
    };
    let Some(secret) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "attach needs the API server's ticket as 'Authorization: Bearer <ticket>'; use `lattice attach`",
        );
    };
    let ticket = match redeem(&ctx, secret.trim()).await {
        Ok(t) => t,
        Err((code, msg)) => return refuse(code, msg),
    };
    if ticket.node != ctx.cfg.node || ticket.namespace != namespace || ticket.name != name {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "the ticket is for {}/{} on node {}, not {namespace}/{name} on {}",
                ticket.namespace, ticket.name, ticket.node, ctx.cfg.node
            ),
        );
    }
    let Ok(ws) = ws else {
        return refuse(StatusCode::BAD_REQUEST, "attach is a WebSocket upgrade");
    };
    let Some(rec) = running(&ctx, &ticket.uid) else {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "allocation {namespace}/{name} is not running on node {}",
                ctx.cfg.node
            ),
        );
    };
    let api: Api<Allocation> = Api::namespaced(ctx.client.clone(), &namespace);
    let alloc = match api.get(&name).await {
        Ok(a) if a.metadata.uid.as_deref() == Some(ticket.uid.as_str()) => a,
        Ok(_) => {
            return refuse(
                StatusCode::CONFLICT,
                format!("allocation {namespace}/{name} was replaced"),
            )
        }
        Err(e) => {
            return refuse(
                StatusCode::BAD_GATEWAY,
                format!("cannot read allocation {namespace}/{name}: {e}"),
            )
        }
    };
    let opt = |k: &str| {
        params
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let size = TerminalSize {
        cols: opt("cols").and_then(|v| v.parse().ok()).unwrap_or(80),
        rows: opt("rows").and_then(|v| v.parse().ok()).unwrap_or(24),
    };
    let user = match crate::policy::resolve(&ctx, &alloc).await {
        Ok(u) => u,
        Err(why) => return refuse(StatusCode::FORBIDDEN, why.message),
    };
    let mut env = workload_env(&ctx, &alloc, &rec, user.as_ref());
    env.insert("LATTICE_ATTACHED".into(), "1".into());
    if ticket.tty {
        env.insert(
            "TERM".into(),
            opt("term").unwrap_or_else(|| "xterm-256color".into()),
        );
    }
    let contained = rec.image_digest.is_some();
    let (program, args) = if contained && ticket.command.is_empty() {
        // The host's login shell need not exist in the image.
        ("/bin/sh".to_string(), Vec::new())
    } else {
        command(&ticket, user.as_ref())
    };
    let mount_ns = match if contained {
        container_mount_ns(&rec)
    } else {
        run_mount_ns(&ctx, &rec)
    } {
        Ok(ns) => ns,
        Err(why) => return refuse(StatusCode::CONFLICT, why),
    };
    if let Some(digest) = &rec.image_digest {
        // The container's environment: the image's under the workload's.
        let Some(image) = crate::oci::cached(&ctx.cfg.state_dir.join("oci"), digest) else {
            return refuse(
                StatusCode::CONFLICT,
                format!("the run's image {digest} is no longer in the node's cache"),
            );
        };
        let pairs: Vec<(String, String)> = env.into_iter().collect();
        env = crate::oci::bundle::merged_env(&image.env, &pairs)
            .into_iter()
            .filter_map(|e| {
                e.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
    }
    let spec = SessionSpec {
        mount_ns,
        contained,
        program,
        args,
        env,
        cwd: workload_cwd(&alloc, &rec),
        user,
        cgroups: rec.cgroup_dirs(),
        tty: ticket.tty.then_some(size),
        stdin: ticket.stdin,
    };
    tracing::info!(allocation = %name, tenant = %namespace, by = %ticket.user, command = ?ticket.command, tty = ticket.tty, "attach session");
    ws.protocols([proto::PROTOCOL])
        .on_upgrade(move |sock| session(ctx, rec, spec, sock))
}

/// Exchange the ticket for its grant.
async fn redeem(ctx: &Ctx, secret: &str) -> Result<AttachTicket, (StatusCode, String)> {
    let req = ctx
        .api
        .http
        .post(ctx.api.url(proto::REDEEM_PATH))
        .timeout(Duration::from_secs(10))
        .json(&proto::RedeemRequest {
            ticket: secret.to_string(),
        });
    let resp = req.send().await.map_err(|e| {
        (
            StatusCode::BAD_GATEWAY,
            format!("cannot redeem the ticket: {e}"),
        )
    })?;
    let code = resp.status();
    let body = resp.bytes().await.unwrap_or_default();
    if !code.is_success() {
        let msg = crate::api::error_message(code.as_u16(), &body);
        let code = if code == StatusCode::FORBIDDEN {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::BAD_GATEWAY
        };
        return Err((code, format!("the API server refused the ticket: {msg}")));
    }
    serde_json::from_slice(&body).map_err(|e| {
        (
            StatusCode::BAD_GATEWAY,
            format!("the API server's ticket does not decode: {e}"),
        )
    })
}

/// This node's live run of the allocation `uid` (the latest attempt).
fn running(ctx: &Ctx, uid: &str) -> Option<TaskRecord> {
    ctx.state
        .read(|s| {
            s.tasks
                .values()
                .filter(|r| r.uid == uid && r.pid.is_some() && r.stop_reason.is_none())
                .max_by_key(|r| r.attempt)
                .cloned()
        })
        .filter(|r| r.pid.is_some_and(crate::runtime::group_exists))
}

/// The ticket's command, or the user's login shell.
fn command(t: &AttachTicket, user: Option<&RunAs>) -> (String, Vec<String>) {
    if let Some((p, rest)) = t.command.split_first() {
        return (p.clone(), rest.to_vec());
    }
    let shell = user
        .and_then(|u| {
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(u.uid))
                .ok()
                .flatten()
        })
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
        })
        .map(|u| u.shell)
        .filter(|s| s.is_file())
        .unwrap_or_else(|| PathBuf::from("/bin/sh"));
    // A terminal gets an interactive shell; without one, the shell reads its input.
    (shell.display().to_string(), Vec::new())
}

struct SessionSpec {
    program: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: PathBuf,
    user: Option<RunAs>,
    cgroups: Vec<PathBuf>,
    tty: Option<TerminalSize>,
    stdin: bool,
    /// The run's supervisor (a pidfd), whose mount namespace (its uenv mounts) the session
    /// enters before anything else.
    mount_ns: Option<OwnedFd>,
    /// `mount_ns` is a container's (an OCI image run).
    contained: bool,
}

/// The mount namespace of `rec`'s run when it has one of its own (uenv images): its
/// shim's, which lives as long as the run.
fn run_mount_ns(ctx: &Ctx, rec: &TaskRecord) -> Result<Option<OwnedFd>, String> {
    if !rec.uenv_mounted {
        return Ok(None);
    }
    let gone = "the run's supervisor is gone; its uenv mounts with it";
    let pid = rec.shim_pid.ok_or(gone)?;
    // A pidfd pins the process: checked below, it cannot be another one by the time
    // the session enters its namespace (a pid can be reused, a pidfd cannot).
    // SAFETY: pidfd_open with a pid and no flags; the result is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(gone.into());
    }
    // SAFETY: a new descriptor of ours.
    let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    let root_owned = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|ids| ids.split_whitespace().all(|id| id == "0"))
        })
        .unwrap_or(false);
    if !root_owned || !ctx.runtime.shim_alive(pid, &rec.run_dir) {
        return Err(gone.into());
    }
    Ok(Some(pidfd))
}

/// The mount namespace of the container of `rec`'s first task (an OCI image run): that
/// of the runtime's child, whose root is the image.
fn container_mount_ns(rec: &TaskRecord) -> Result<Option<OwnedFd>, String> {
    let gone = "the run's container is gone";
    let runtime = rec.pid.ok_or(gone)?;
    let children = std::fs::read_to_string(format!("/proc/{runtime}/task/{runtime}/children"))
        .map_err(|_| gone)?;
    let pid: i32 = children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or(gone)?;
    // SAFETY: pidfd_open with a pid and no flags; the result is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(gone.into());
    }
    // SAFETY: a new descriptor of ours.
    let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    // Pinned by the pidfd: it is still the runtime's child (not a reused pid).
    let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|p| p.parse::<u32>().ok());
    if parent != Some(runtime) {
        return Err(gone.into());
    }
    Ok(Some(pidfd))
}

/// A started session: its process and where its bytes go.
struct Started {
    child: tokio::process::Child,
    /// Output chunks: (channel, bytes); closed when every output stream ended.
    output: mpsc::Receiver<(u8, Bytes)>,
    /// Input and resizes (bounded: a command that does not read holds the client back).
    input: Option<mpsc::Sender<Input>>,
}

enum Input {
    Bytes(Bytes),
    Resize(TerminalSize),
    Close,
}

fn winsize(s: TerminalSize) -> libc::winsize {
    libc::winsize {
        ws_row: s.rows,
        ws_col: s.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Not inherited by anything the agent starts later (another user's workload, say).
fn cloexec(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
        .map(drop)
        .map_err(std::io::Error::from)
}

fn c_path(p: &std::path::Path) -> std::io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} contains a NUL byte", p.display()),
        )
    })
}

/// Start the command. The child joins the run's cgroup, drops to the user and only then
/// enters the working directory (as the user, so it reaches nothing the user could not).
fn start(spec: &SessionSpec) -> std::io::Result<Started> {
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(&spec.env)
        .kill_on_drop(false);
    let procs = crate::cgroup::procs_files(&spec.cgroups)?;
    let cwd = c_path(&spec.cwd)?;
    let ids = spec.user.as_ref().map(|u| (u.uid, u.gid));
    let groups: Vec<libc::gid_t> = spec
        .user
        .as_ref()
        .map(|u| {
            if u.groups.is_empty() {
                vec![u.gid]
            } else {
                u.groups.clone()
            }
        })
        .unwrap_or_default();
    let tty = spec.tty.is_some();
    let mount_ns = spec.mount_ns.as_ref().map(|f| f.as_raw_fd());
    let contained = spec.contained;
    let mut pty_master: Option<OwnedFd> = None;
    if let Some(size) = spec.tty {
        let pty = nix::pty::openpty(Some(&winsize(size)), None).map_err(std::io::Error::from)?;
        cloexec(&pty.master)?;
        cloexec(&pty.slave)?;
        if let Some((uid, _)) = ids {
            // The user's terminal; its group stays `tty` (mode 0620, as login gives).
            nix::unistd::fchown(
                pty.slave.as_raw_fd(),
                Some(nix::unistd::Uid::from_raw(uid)),
                None,
            )
            .map_err(std::io::Error::from)?;
        }
        cmd.stdin(Stdio::from(pty.slave.try_clone()?))
            .stdout(Stdio::from(pty.slave.try_clone()?))
            .stderr(Stdio::from(pty.slave));
        pty_master = Some(pty.master);
    } else {
        cmd.stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    }
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            crate::runtime::cloexec_inherited();
            // The run's cgroups (its limits, and they end with the run): a session
            // outside them is refused rather than left unbounded. Joined first: a
            // container's view of /sys is read-only.
            crate::cgroup::join(&procs)?;
            // The run's uenv mounts, or its container's root file system (a
            // single-threaded child may enter a mount namespace; entering one moves the
            // root and working directories to its root).
            if let Some(ns) = mount_ns {
                if libc::setns(ns, libc::CLONE_NEWNS) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // As the container's own processes: no privilege gained by exec, and no
            // capability kept (a root session in an image gets none either).
            if contained {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                for cap in 0..64 {
                    libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
                }
                if ids.is_none() {
                    #[repr(C)]
                    struct Header {
                        version: u32,
                        pid: i32,
                    }
                    #[repr(C)]
                    struct Data {
                        effective: u32,
                        permitted: u32,
                        inheritable: u32,
                    }
                    let mut h = Header {
                        version: 0x2008_0522,
                        pid: 0,
                    };
                    let d = [
                        Data {
                            effective: 0,
                            permitted: 0,
                            inheritable: 0,
                        },
                        Data {
                            effective: 0,
                            permitted: 0,
                            inheritable: 0,
                        },
                    ];
                    if libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if tty && libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((uid, gid)) = ids {
                if libc::setgroups(groups.len(), groups.as_ptr()) < 0
                    || libc::setgid(gid) < 0
                    || libc::setuid(uid) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::chdir(cwd.as_ptr()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    // Our copies of the terminal's slave side went with `cmd`: the master reads EOF (EIO)
    // once the session's processes closed theirs.
    drop(cmd);
    match wire(&mut child, pty_master) {
        Ok((output, input)) => Ok(Started {
            child,
            output,
            input,
        }),
        Err(e) => {
            // Never a session nobody watches.
            if let Some(sid) = child.id() {
                signal_session(sid, Signal::SIGKILL);
            }
            Err(e)
        }
    }
}

type Wired = (mpsc::Receiver<(u8, Bytes)>, Option<mpsc::Sender<Input>>);

/// Threads between the started command and the session: output out, input in.
fn wire(child: &mut tokio::process::Child, pty_master: Option<OwnedFd>) -> std::io::Result<Wired> {
    let (out_tx, output) = mpsc::channel(64);
    let input = if let Some(master) = pty_master {
        let reader = std::fs::File::from(master);
        let writer = reader.try_clone()?;
        pump(reader, proto::STDOUT, out_tx);
        Some(feed(writer, true))
    } else {
        if let Some(o) = child.stdout.take() {
            pump(blocking(o.into_owned_fd()?)?, proto::STDOUT, out_tx.clone());
        }
        if let Some(e) = child.stderr.take() {
            pump(blocking(e.into_owned_fd()?)?, proto::STDERR, out_tx);
        }
        match child.stdin.take() {
            Some(i) => Some(feed(blocking(i.into_owned_fd()?)?, false)),
            None => None,
        }
    };
    Ok((output, input))
}

/// tokio's pipe ends are non-blocking; the pump threads want blocking ones.
fn blocking(fd: OwnedFd) -> std::io::Result<std::fs::File> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags)).map_err(std::io::Error::from)?;
    Ok(std::fs::File::from(fd))
}

/// Copy `src` to `tx` on a thread (blocking reads; a terminal's master ends with EIO).
fn pump(mut src: std::fs::File, channel: u8, tx: mpsc::Sender<(u8, Bytes)>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match src.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .blocking_send((channel, Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
}

/// Write input to `dst` on a thread; resizes apply to a terminal.
fn feed(dst: std::fs::File, terminal: bool) -> mpsc::Sender<Input> {
    let (tx, mut rx) = mpsc::channel::<Input>(64);
    std::thread::spawn(move || {
        let mut dst = Some(dst);
        while let Some(m) = rx.blocking_recv() {
            let Some(f) = dst.as_mut() else { break };
            match m {
                Input::Bytes(b) => {
                    if f.write_all(&b).is_err() {
                        break;
                    }
                }
                Input::Resize(s) if terminal => {
                    let ws = winsize(s);
                    // SAFETY: TIOCSWINSZ reads one winsize from the pointer.
                    unsafe { libc::ioctl(f.as_raw_fd(), libc::TIOCSWINSZ as _, &ws) };
                }
                Input::Resize(_) => {}
                // A terminal's end of input is its EOF character; a pipe closes.
                Input::Close if terminal => {
                    let _ = f.write_all(&[4]);
                }
                Input::Close => dst = None,
            }
        }
    });
    tx
}

/// Signal every process in session `sid` (an interactive shell gives each of its jobs a
/// process group of its own, all in its session); how many there were.
fn signal_session(sid: u32, sig: Signal) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp session ...`; comm may hold spaces and parentheses.
        let session = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(3))
            .and_then(|s| s.parse::<u32>().ok());
        if session == Some(sid) {
            let _ = kill(Pid::from_raw(pid), sig);
            n += 1;
        }
    }
    n
}

/// The terminal went away: SIGHUP (and SIGCONT, for stopped jobs) to the session's
/// processes, SIGKILL to those left after [`HANGUP_GRACE`]. (A process that made a session
/// of its own is beyond this; the run's cgroup still ends it with the run.)
fn hang_up(sid: Option<u32>) {
    let Some(sid) = sid else {
        return;
    };
    // Scanning /proc blocks: not on the async runtime.
    std::thread::spawn(move || {
        if signal_session(sid, Signal::SIGHUP) == 0 {
            return;
        }
        signal_session(sid, Signal::SIGCONT);
        std::thread::sleep(HANGUP_GRACE);
        signal_session(sid, Signal::SIGKILL);
    });
}

async fn send_status(tx: &mut futures::stream::SplitSink<WebSocket, Message>, st: &AttachStatus) {
    let body = serde_json::to_vec(st).unwrap_or_default();
    send_frame(tx, proto::STATUS, &body).await;
}

/// How long a client may take to accept output before it counts as gone.
const SEND_LIMIT: Duration = Duration::from_secs(30);

async fn send_frame(
    tx: &mut futures::stream::SplitSink<WebSocket, Message>,
    channel: u8,
    data: &[u8],
) -> bool {
    let m = Message::Binary(proto::frame(channel, data).into());
    matches!(
        tokio::time::timeout(SEND_LIMIT, tx.send(m)).await,
        Ok(Ok(()))
    )
}

async fn session(ctx: Arc<Ctx>, rec: TaskRecord, spec: SessionSpec, sock: WebSocket) {
    ctx.metrics.attach_sessions.inc();
    ctx.metrics.attach_sessions_open.inc();
    let (mut tx, mut rx) = sock.split();
    let mut started = match start(&spec) {
        Ok(s) => s,
        Err(e) => {
            let error = Some(format!("cannot start {:?}: {e}", spec.program));
            send_status(
                &mut tx,
                &AttachStatus {
                    error,
                    ..Default::default()
                },
            )
            .await;
            let _ = tx.send(Message::Close(None)).await;
            ctx.metrics.attach_sessions_open.dec();
            return;
        }
    };
    let pgid = started.child.id();
    let forward_input = spec.stdin;
    let mut check = tokio::time::interval(RUN_CHECK);
    let mut client_open = true;
    let mut output_open = true;
    let mut exited: Option<std::process::ExitStatus> = None;
    let status = loop {
        tokio::select! {
            out = started.output.recv(), if output_open => match out {
                Some((ch, b)) => {
                    if !send_frame(&mut tx, ch, &b).await {
                        client_open = false;
                        hang_up(pgid);
                        break None;
                    }
                }
                None => {
                    output_open = false;
                    if let Some(st) = exited {
                        break Some(exit_status(st));
                    }
                }
            },
            // While the command's input is backed up, the client waits (TCP backpressure).
            msg = rx.next(), if client_open && started.input.as_ref().is_none_or(|i| i.capacity() > 0) => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let Some((&ch, data)) = b.split_first() else { continue };
                    let m = match ch {
                        proto::STDIN if forward_input => Input::Bytes(Bytes::copy_from_slice(data)),
                        proto::RESIZE => match serde_json::from_slice::<TerminalSize>(data) {
                            Ok(s) => Input::Resize(s),
                            Err(_) => continue,
                        },
                        proto::CLOSE if forward_input && data == [proto::STDIN] => Input::Close,
                        _ => continue,
                    };
                    if let Some(i) = &started.input {
                        let _ = i.try_send(m);
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    client_open = false;
                    hang_up(pgid);
                    break None;
                }
                Some(Ok(_)) => {}
            },
            st = started.child.wait(), if exited.is_none() => {
                let st = match st {
                    Ok(s) => s,
                    Err(e) => break Some(AttachStatus { error: Some(format!("waiting for the command: {e}")), ..Default::default() }),
                };
                exited = Some(st);
                // Whatever the command left running in its session goes with it (as
                // when a terminal closes); its output drains first.
                hang_up(pgid);
                // Killed because the run ended (its cgroups are emptied with it): say
                // so, rather than pass the kill on as the command's own doing.
                if std::os::unix::process::ExitStatusExt::signal(&st).is_some()
                    && running(&ctx, &rec.uid).is_none()
                {
                    break Some(AttachStatus {
                        error: Some(format!("allocation {}/{} stopped running on this node", rec.namespace, rec.name)),
                        ..Default::default()
                    });
                }
                if !output_open {
                    break Some(exit_status(st));
                }
                // A process that left the session may hold the output open: not for long.
                let drained = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some((ch, b)) = started.output.recv().await {
                        if !send_frame(&mut tx, ch, &b).await {
                            break;
                        }
                    }
                })
                .await;
                let _ = drained;
                break Some(exit_status(st));
            }
            _ = check.tick() => {
                if running(&ctx, &rec.uid).is_none() {
                    hang_up(pgid);
                    break Some(AttachStatus {
                        error: Some(format!("allocation {}/{} stopped running on this node", rec.namespace, rec.name)),
                        ..Default::default()
                    });
                }
            }
        }
    };
    if let Some(st) = status {
        send_status(&mut tx, &st).await;
        let _ = tx.send(Message::Close(None)).await;
        // The close handshake: dropping the socket before the peer's Close arrives
        // resets the connection, and a reset can discard the status in flight.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(Ok(m)) = rx.next().await {
                if matches!(m, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
    if exited.is_none() {
        let _ = started.child.wait().await;
    }
    ctx.metrics.attach_sessions_open.dec();
    tracing::info!(allocation = %rec.name, tenant = %rec.namespace, client_open, "attach session ended");
}

fn exit_status(st: std::process::ExitStatus) -> AttachStatus {
    use std::os::unix::process::ExitStatusExt;
    AttachStatus {
        exit_code: st.code(),
        signal: st.signal(),
        error: None,
    }
}
