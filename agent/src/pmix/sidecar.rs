//! `lattice-agent pmix-server --fd 3`: the PMIx server of one step on one node (run by
//! the agent as the job's user; see the module docs of [`crate::pmix`]).

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, OnceLock};

use super::ffi;
use super::{read_frame, write_frame, Aborted, Job};

/// Where the sidecar's frames go (the library calls back from its own thread).
static TO_AGENT: OnceLock<Mutex<UnixStream>> = OnceLock::new();
/// The fences handed to the agent and not yet answered, oldest first: the library's
/// completion function and its argument.
static PENDING: Mutex<VecDeque<(usize, usize)>> = Mutex::new(VecDeque::new());

fn send(kind: u8, payload: &[u8]) {
    if let Some(w) = TO_AGENT.get() {
        let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = write_frame(&mut *w, kind, payload) {
            eprintln!("lattice pmix-server: cannot write to the agent: {e}");
        }
    }
}

extern "C" fn on_fence(
    data: *const c_char,
    ndata: usize,
    cbfunc: *mut c_void,
    cbdata: *mut c_void,
) {
    let bytes = if data.is_null() || ndata == 0 {
        Vec::new()
    } else {
        // SAFETY: the library passes `ndata` bytes at `data`, valid during the call.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), ndata) }.to_vec()
    };
    // Queued before it is sent: the answer cannot overtake it.
    PENDING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back((cbfunc as usize, cbdata as usize));
    send(b'F', &bytes);
}

extern "C" fn on_abort(rank: u32, status: c_int, msg: *const c_char) {
    let message = if msg.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string from the library, valid during the call.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .chars()
            .take(1024)
            .collect()
    };
    if let Ok(json) = serde_json::to_vec(&Aborted {
        rank,
        status,
        message,
        lost: false,
    }) {
        send(b'A', &json);
    }
}

extern "C" fn on_lost(rank: u32) {
    if let Ok(json) = serde_json::to_vec(&Aborted {
        rank,
        status: 0,
        message: String::new(),
        lost: true,
    }) {
        send(b'A', &json);
    }
}

fn error(rc: c_int) -> String {
    // SAFETY: the library returns a static string for every code.
    let s = unsafe { ffi::lp_error(rc) };
    if s.is_null() {
        format!("PMIx error {rc}")
    } else {
        format!("{} ({rc})", unsafe { CStr::from_ptr(s) }.to_string_lossy())
    }
}

fn cstring(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

/// Run the sidecar on descriptor `fd`; returns the exit code.
pub fn run(fd: i32) -> i32 {
    if fd <= 2 {
        eprintln!("lattice pmix-server: --fd {fd} is a standard stream");
        return 2;
    }
    // SAFETY: the agent passed this socket for us alone.
    let mut sock = unsafe { UnixStream::from_raw_fd(fd) };
    match serve(&mut sock) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("lattice pmix-server: {e}");
            if TO_AGENT.get().is_some() {
                send(b'X', e.as_bytes());
            } else {
                let _ = write_frame(&mut sock, b'X', e.as_bytes());
            }
            1
        }
    }
}

fn serve(sock: &mut UnixStream) -> Result<(), String> {
    let job: Job = match read_frame(sock).map_err(|e| e.to_string())? {
        Some((b'J', b)) => serde_json::from_slice(&b).map_err(|e| format!("the job: {e}"))?,
        _ => return Err("the agent sent no job".into()),
    };
    let writer = sock.try_clone().map_err(|e| e.to_string())?;
    let _ = TO_AGENT.set(Mutex::new(writer));

    // The rendezvous directory: the user's own, made by the agent in the run directory
    // (removed with it, also when this process is killed).
    let tmp = std::path::PathBuf::from(&job.tmpdir);
    run_server(sock, &job, &tmp)
}

fn run_server(sock: &mut UnixStream, job: &Job, tmp: &std::path::Path) -> Result<(), String> {
    let dir = cstring(&tmp.display().to_string())?;
    // SAFETY: valid C strings and callbacks that live as long as the process.
    let rc = unsafe { ffi::lp_init(dir.as_ptr(), on_fence, on_abort, on_lost) };
    if rc != 0 {
        return Err(format!("PMIx_server_init: {}", error(rc)));
    }
    let served = register_and_serve(sock, job);
    // SAFETY: after a successful init.
    unsafe { ffi::lp_finalize() };
    served
}

fn register_and_serve(sock: &mut UnixStream, job: &Job) -> Result<(), String> {
    let size = job.size();
    let here = job.node_index as usize;
    let local = job
        .ranks
        .get(here)
        .cloned()
        .ok_or("the job does not list this node's ranks")?;
    let mut node_of = vec![0u32; size as usize];
    let mut local_rank_of = vec![0u32; size as usize];
    for (n, ranks) in job.ranks.iter().enumerate() {
        for (l, r) in ranks.iter().enumerate() {
            let r = *r as usize;
            if r >= node_of.len() {
                return Err(format!("rank {r} is beyond the step's {size} ranks"));
            }
            node_of[r] = n as u32;
            local_rank_of[r] = l as u32;
        }
    }
    let nspace = cstring(&job.nspace)?;
    let hosts = cstring(&job.nodes.join(","))?;
    let host = cstring(job.nodes.get(here).map_or("", String::as_str))?;
    let ppn = cstring(&super::ppn(&job.ranks))?;
    // SAFETY: valid C strings and arrays of the lengths given.
    let rc = unsafe {
        ffi::lp_register(
            nspace.as_ptr(),
            nspace.as_ptr(),
            job.nodes.len() as u32,
            job.node_index,
            hosts.as_ptr(),
            host.as_ptr(),
            ppn.as_ptr(),
            size,
            node_of.as_ptr(),
            local_rank_of.as_ptr(),
            local.as_ptr(),
            local.len() as u32,
        )
    };
    if rc != 0 {
        return Err(format!("PMIx_server_register_nspace: {}", error(rc)));
    }
    let mut envs: Vec<Vec<(String, String)>> = Vec::with_capacity(local.len());
    for r in &local {
        let mut env: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: `env` receives an array the library allocated, freed below.
        let rc = unsafe { ffi::lp_client(nspace.as_ptr(), *r, job.uid, job.gid, &mut env) };
        let mut vars = Vec::new();
        if !env.is_null() {
            let mut i = 0;
            loop {
                // SAFETY: a NULL-terminated array of C strings.
                let p = unsafe { *env.add(i) };
                if p.is_null() {
                    break;
                }
                let kv = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
                if let Some((k, v)) = kv.split_once('=') {
                    // Only the library's own variables: the array starts empty.
                    vars.push((k.to_string(), v.to_string()));
                }
                i += 1;
            }
            // SAFETY: the array from lp_client.
            unsafe { ffi::lp_free_env(env) };
        }
        if rc != 0 {
            return Err(format!(
                "PMIx_server_setup_fork for rank {r}: {}",
                error(rc)
            ));
        }
        envs.push(vars);
    }
    send(b'E', &serde_json::to_vec(&envs).map_err(|e| e.to_string())?);
    loop {
        let frame = read_frame(sock).map_err(|e| format!("reading from the agent: {e}"))?;
        let Some((kind, data)) = frame else {
            return Ok(());
        };
        let ok = match kind {
            b'R' => 1,
            b'X' => 0,
            other => {
                return Err(format!(
                    "unexpected frame {:?} from the agent",
                    other as char
                ))
            }
        };
        let next = PENDING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        let Some((cbfunc, cbdata)) = next else {
            return Err("a fence answer without a fence".into());
        };
        // SAFETY: the completion function and argument the library gave for this fence;
        // the data is copied by the C side.
        unsafe {
            ffi::lp_fence_done(
                cbfunc as *mut c_void,
                cbdata as *mut c_void,
                ok,
                data.as_ptr().cast(),
                if ok == 1 { data.len() } else { 0 },
            )
        };
    }
}
