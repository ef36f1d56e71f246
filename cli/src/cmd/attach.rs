//! `lattice attach ID [--node NODE] [--command CMD | -- CMD ARGS...]`: a terminal (or a
//! command) inside a running allocation, through the API server's `.../attach`
//! WebSocket (protocol: [`lattice_apis::attach`]).
//!
//! With a terminal here (or `--tty`), the remote command gets a pseudo-terminal of this
//! one's size (kept in step on SIGWINCH) and this terminal is in raw mode until it ends:
//! Ctrl-C, Ctrl-Z and friends go to the remote side. Without one (or with `--no-tty`), input,
//! output and error output are forwarded as they are. The exit status is the remote
//! command's (128 + N for a signal N).

use std::io::{IsTerminal, Read, Write};

use futures::{SinkExt, StreamExt};
use lattice_apis::attach::{self as proto, AttachStatus, TerminalSize};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::cli::AttachArgs;
use crate::client::ClientError;
use crate::cmd::workload::object;
use crate::errors::{exit, CliError};
use crate::{Ctx, Shutdown};

/// This terminal's size.
fn terminal_size() -> Option<TerminalSize> {
    // SAFETY: TIOCGWINSZ writes one winsize.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0 && ws.ws_row > 0).then_some(TerminalSize {
        cols: ws.ws_col,
        rows: ws.ws_row,
    })
}

/// Raw mode on standard input until dropped.
struct RawMode(Option<libc::termios>);

impl RawMode {
    fn enter() -> RawMode {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a zeroed termios they fill in.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut t) != 0 {
                return RawMode(None);
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &t) != 0 {
                return RawMode(None);
            }
            RawMode(Some(saved))
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            // SAFETY: restores the attributes read in `enter`.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t) };
        }
    }
}

/// Standard input on a thread (reads block); `None` at its end.
fn read_stdin() -> mpsc::Receiver<Option<Vec<u8>>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 8192];
        let mut stdin = std::io::stdin().lock();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.blocking_send(None);
                    break;
                }
                Ok(n) => {
                    if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// The next delivery of `sig` (never, for one that could not be set up).
async fn next_signal(sig: &mut Option<tokio::signal::unix::Signal>) {
    if let Some(s) = sig {
        if s.recv().await.is_some() {
            return;
        }
    }
    std::future::pending().await
}

/// Runs `lattice attach`.
pub async fn run(
    ctx: &Ctx,
    a: &AttachArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    attach(ctx, &ctx.tenant, a, out, err, &mut shutdown).await
}

/// Attaches to allocation `a.id` of `tenant` (also for `lattice session`, `lattice launch
/// --pty` and `srun --pty`).
pub async fn attach(
    ctx: &Ctx,
    tenant: &str,
    a: &AttachArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<i32, CliError> {
    let here_tty = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let tty = a.tty || (here_tty && !a.no_tty);
    let stdin = !a.no_stdin;
    let command: Vec<String> = match &a.command {
        Some(c) => vec!["/bin/sh".into(), "-c".into(), c.clone()],
        None => a.args.clone(),
    };
    let mut url =
        reqwest::Url::parse("http://x/").map_err(|e| CliError::new("attach", e.to_string()))?;
    {
        let mut q = url.query_pairs_mut();
        if let Some(n) = &a.node {
            q.append_pair("node", n);
        }
        for c in &command {
            q.append_pair("command", c);
        }
        q.append_pair("tty", if tty { "true" } else { "false" });
        q.append_pair("stdin", if stdin { "true" } else { "false" });
        if tty {
            let size = terminal_size().unwrap_or(TerminalSize { cols: 80, rows: 24 });
            q.append_pair("cols", &size.cols.to_string());
            q.append_pair("rows", &size.rows.to_string());
            if let Some(t) = ctx.env.get("TERM") {
                q.append_pair("term", &t);
            }
        }
    }
    let path = format!(
        "{}/attach?{}",
        object("allocations", Some(tenant), &a.id),
        url.query().unwrap_or_default()
    );
    let upgraded = ctx
        .client
        .websocket(&path, proto::PROTOCOL)
        .await
        .map_err(|e| {
            let not_running =
                matches!(&e, ClientError::Status { status, .. } if status.code == 409);
            let ce = CliError::from_client(format!("attach {}", a.id), e);
            if not_running {
                ce.hint(format!(
                    "attach needs a Running allocation; `lattice watch {}` shows when it starts",
                    a.id
                ))
            } else {
                ce
            }
        })?;
    let sock = WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
    let (mut tx, mut rx) = sock.split();

    // Raw mode hands Ctrl-C and friends to the remote side, so only when input goes there.
    let raw = (tty && stdin).then(RawMode::enter);
    let mut input = if stdin { Some(read_stdin()) } else { None };
    let mut winch = if tty {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
    } else {
        None
    };
    // SIGTERM or SIGHUP (this terminal closed) hang the remote side up, and this terminal
    // gets its mode back.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).ok();
    let mut hup = signal(SignalKind::hangup()).ok();
    let mut status: Option<AttachStatus> = None;
    let mut stopped_by: Option<i32> = None;
    loop {
        tokio::select! {
            m = rx.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    let Some((&ch, data)) = b.split_first() else { continue };
                    match ch {
                        proto::STDOUT => {
                            out.write_all(data)?;
                            out.flush()?;
                        }
                        proto::STDERR => {
                            err.write_all(data)?;
                            err.flush()?;
                        }
                        proto::STATUS => {
                            status = serde_json::from_slice(data).ok();
                        }
                        _ => {}
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            chunk = async {
                match input.as_mut() {
                    Some(i) => i.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let frame = match chunk.flatten() {
                    Some(bytes) => proto::frame(proto::STDIN, &bytes),
                    None => {
                        input = None;
                        proto::frame(proto::CLOSE, &[proto::STDIN])
                    }
                };
                if tx.send(Message::Binary(frame.into())).await.is_err() {
                    break;
                }
            }
            _ = async {
                match winch.as_mut() {
                    Some(w) => { w.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {
                if let Some(size) = terminal_size() {
                    let body = serde_json::to_vec(&size).unwrap_or_default();
                    let _ = tx.send(Message::Binary(proto::frame(proto::RESIZE, &body).into())).await;
                }
            }
            _ = &mut *shutdown => {
                stopped_by = Some(libc::SIGINT);
                let _ = tx.send(Message::Close(None)).await;
                break;
            }
            _ = next_signal(&mut term) => {
                stopped_by = Some(libc::SIGTERM);
                let _ = tx.send(Message::Close(None)).await;
                break;
            }
            _ = next_signal(&mut hup) => {
                stopped_by = Some(libc::SIGHUP);
                let _ = tx.send(Message::Close(None)).await;
                break;
            }
        }
    }
    drop(raw);
    if let Some(sig) = stopped_by {
        return Ok(128 + sig);
    }
    match status {
        Some(AttachStatus { error: Some(e), .. }) => {
            Err(CliError::new(format!("attach {}", a.id), e).exit_code(exit::ERROR))
        }
        Some(st) => Ok(st.shell_code()),
        None => Err(CliError::new(
            format!("attach {}", a.id),
            "the connection closed before the command ended",
        )
        .exit_code(exit::UNREACHABLE)),
    }
}
