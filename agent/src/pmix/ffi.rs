//! The C side (`pmix/glue.c`), linked with OpenPMIx.

use std::ffi::{c_char, c_int, c_void};

pub type FenceFn =
    extern "C" fn(data: *const c_char, ndata: usize, cbfunc: *mut c_void, cbdata: *mut c_void);
pub type AbortFn = extern "C" fn(rank: u32, status: c_int, msg: *const c_char);
pub type LostFn = extern "C" fn(rank: u32);

extern "C" {
    pub fn lp_init(tmpdir: *const c_char, fence: FenceFn, abort: AbortFn, lost: LostFn) -> c_int;
    pub fn lp_finalize();
    pub fn lp_error(rc: c_int) -> *const c_char;
    #[allow(clippy::too_many_arguments)]
    pub fn lp_register(
        nspace: *const c_char,
        jobid: *const c_char,
        nnodes: u32,
        nodeid: u32,
        hosts_csv: *const c_char,
        host: *const c_char,
        ppn: *const c_char,
        univ: u32,
        node_of: *const u32,
        local_rank_of: *const u32,
        local: *const u32,
        nlocal: u32,
    ) -> c_int;
    pub fn lp_client(
        nspace: *const c_char,
        rank: u32,
        uid: u32,
        gid: u32,
        env: *mut *mut *mut c_char,
    ) -> c_int;
    pub fn lp_free_env(env: *mut *mut c_char);
    pub fn lp_fence_done(
        cbfunc: *mut c_void,
        cbdata: *mut c_void,
        ok: c_int,
        data: *const c_char,
        n: usize,
    );
}
