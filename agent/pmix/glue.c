/*
 * The C side of the agent's PMIx sidecar (`lattice-agent pmix-server`, cargo feature
 * `pmix`): the few calls into OpenPMIx's server library that need its C structures,
 * behind a small interface of plain types that src/pmix/ffi.rs declares.
 *
 * The sidecar is a PMIx server for one job step on one node: it registers the step's
 * namespace (job-level and per-rank information, as a resource manager does), registers
 * this node's ranks as clients and hands the agent their environment, and passes each
 * fence's local contribution up to the Rust side (which exchanges it across nodes
 * through the agent) and the combined data back down.
 */
#include <pmix.h>
#include <pmix_server.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void (*lp_fence_fn)(const char *data, size_t ndata, void *cbfunc, void *cbdata);
typedef void (*lp_abort_fn)(uint32_t rank, int status, const char *msg);
typedef void (*lp_lost_fn)(uint32_t rank);

static lp_fence_fn on_fence;
static lp_abort_fn on_abort;
static lp_lost_fn on_lost;
/* The step's namespace: fences over it alone are served. */
static char served[PMIX_MAX_NSLEN + 1];

/* A one-shot completion flag for the library's asynchronous calls. */
typedef struct {
    volatile int active;
    pmix_status_t status;
} lp_wait_t;

static void op_done(pmix_status_t status, void *cbdata)
{
    lp_wait_t *w = (lp_wait_t *) cbdata;
    w->status = status;
    __atomic_store_n(&w->active, 0, __ATOMIC_RELEASE);
}

static pmix_status_t lp_wait(lp_wait_t *w, pmix_status_t rc)
{
    if (PMIX_SUCCESS != rc) {
        return rc;
    }
    while (__atomic_load_n(&w->active, __ATOMIC_ACQUIRE)) {
        usleep(100);
    }
    return w->status;
}

static pmix_status_t connected(const pmix_proc_t *proc, void *server_object,
                               pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void) proc; (void) server_object; (void) cbfunc; (void) cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t finalized(const pmix_proc_t *proc, void *server_object,
                               pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void) proc; (void) server_object; (void) cbfunc; (void) cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t aborted(const pmix_proc_t *proc, void *server_object, int status,
                             const char msg[], pmix_proc_t procs[], size_t nprocs,
                             pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void) server_object; (void) procs; (void) nprocs; (void) cbfunc; (void) cbdata;
    if (NULL != on_abort) {
        on_abort(NULL == proc ? UINT32_MAX : proc->rank, status, NULL == msg ? "" : msg);
    }
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                           size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cbfunc,
                           void *cbdata)
{
    (void) info; (void) ninfo;
    /* Fences over the whole step only: the agents' exchange runs them in one order on
     * every node; a fence over some ranks would pair with another one elsewhere. */
    if (NULL == on_fence || 1 != nprocs || PMIX_RANK_WILDCARD != procs[0].rank
        || 0 != strncmp(procs[0].nspace, served, PMIX_MAX_NSLEN)) {
        return PMIX_ERR_NOT_SUPPORTED;
    }
    on_fence(data, ndata, (void *) cbfunc, cbdata);
    return PMIX_SUCCESS;
}

static pmix_status_t direct_modex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                                  pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
    (void) proc; (void) info; (void) ninfo; (void) cbfunc; (void) cbdata;
    /* Every fence collects all data: there is nothing to ask another node for. */
    return PMIX_ERR_NOT_SUPPORTED;
}

/* A local client went away without PMIx_Finalize (killed, crashed): the step ends on
 * every node. */
static void lost(size_t id, pmix_status_t status, const pmix_proc_t *source,
                 pmix_info_t info[], size_t ninfo, pmix_info_t results[], size_t nresults,
                 pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    (void) id; (void) status; (void) info; (void) ninfo; (void) results; (void) nresults;
    if (NULL != on_lost && NULL != source) {
        on_lost(source->rank);
    }
    if (NULL != cbfunc) {
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
    }
}

static pmix_server_module_t module = {
    .client_connected = connected,
    .client_finalized = finalized,
    .abort = aborted,
    .fence_nb = fence,
    .direct_modex = direct_modex,
};

int lp_init(const char *tmpdir, lp_fence_fn fence_cb, lp_abort_fn abort_cb, lp_lost_fn lost_cb)
{
    pmix_info_t *info;
    pmix_status_t rc;
    on_fence = fence_cb;
    on_abort = abort_cb;
    on_lost = lost_cb;
    PMIX_INFO_CREATE(info, 2);
    PMIX_INFO_LOAD(&info[0], PMIX_SERVER_TMPDIR, tmpdir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[1], PMIX_SYSTEM_TMPDIR, tmpdir, PMIX_STRING);
    rc = PMIx_server_init(&module, info, 2);
    PMIX_INFO_FREE(info, 2);
    if (PMIX_SUCCESS == rc) {
        pmix_status_t codes[2] = {PMIX_ERR_LOST_CONNECTION, PMIX_ERR_PROC_TERM_WO_SYNC};
        rc = PMIx_Register_event_handler(codes, 2, NULL, 0, lost, NULL, NULL);
        /* Registration may complete later (a reference number comes back). */
        if (rc > 0) {
            rc = PMIX_SUCCESS;
        }
    }
    return rc;
}

void lp_finalize(void)
{
    PMIx_server_finalize();
}

const char *lp_error(int rc)
{
    return PMIx_Error_string(rc);
}

/*
 * Register namespace `nspace` (this node is `nodeid` of `nnodes`, named `hosts_csv`;
 * `ppn` is PMIx_generate_ppn's input, "0,2;1,3"): `univ` ranks, `node_of[r]` and
 * `local_rank_of[r]` for each, `local[0..nlocal]` the ranks here.
 */
int lp_register(const char *nspace, const char *jobid, uint32_t nnodes, uint32_t nodeid,
                const char *hosts_csv, const char *host, const char *ppn, uint32_t univ,
                const uint32_t *node_of, const uint32_t *local_rank_of, const uint32_t *local,
                uint32_t nlocal)
{
    char *node_map = NULL, *proc_map = NULL, *peers;
    size_t n, ninfo, i = 0, len = 0;
    pmix_info_t *info;
    pmix_status_t rc;
    lp_wait_t w = {1, PMIX_SUCCESS};
    uint32_t zero = 0, leader = nlocal > 0 ? local[0] : 0;

    strncpy(served, nspace, PMIX_MAX_NSLEN);
    if (PMIX_SUCCESS != (rc = PMIx_generate_regex(hosts_csv, &node_map))) {
        return rc;
    }
    if (PMIX_SUCCESS != (rc = PMIx_generate_ppn(ppn, &proc_map))) {
        free(node_map);
        return rc;
    }
    peers = calloc((size_t) nlocal * 11 + 1, 1);
    if (NULL == peers) {
        return PMIX_ERR_NOMEM;
    }
    for (n = 0; n < nlocal; n++) {
        len += (size_t) sprintf(peers + len, n ? ",%u" : "%u", local[n]);
        if (local[n] < leader) {
            leader = local[n];
        }
    }

    ninfo = 14 + univ;
    PMIX_INFO_CREATE(info, ninfo);
    PMIX_INFO_LOAD(&info[i++], PMIX_UNIV_SIZE, &univ, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[i++], PMIX_JOB_SIZE, &univ, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[i++], PMIX_MAX_PROCS, &univ, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[i++], PMIX_APP_SIZE, &univ, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[i++], PMIX_JOBID, jobid, PMIX_STRING);
    PMIX_INFO_LOAD(&info[i++], PMIX_NODE_MAP, node_map, PMIX_REGEX);
    PMIX_INFO_LOAD(&info[i++], PMIX_PROC_MAP, proc_map, PMIX_REGEX);
    PMIX_INFO_LOAD(&info[i++], PMIX_NUM_NODES, &nnodes, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[i++], PMIX_NODEID, &nodeid, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[i++], PMIX_HOSTNAME, host, PMIX_STRING);
    PMIX_INFO_LOAD(&info[i++], PMIX_LOCAL_SIZE, &nlocal, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[i++], PMIX_LOCAL_PEERS, peers, PMIX_STRING);
    PMIX_INFO_LOAD(&info[i++], PMIX_LOCALLDR, &leader, PMIX_PROC_RANK);
    PMIX_INFO_LOAD(&info[i++], PMIX_APPNUM, &zero, PMIX_UINT32);
    for (uint32_t r = 0; r < univ; r++) {
        pmix_data_array_t *arr;
        pmix_info_t *pi;
        uint16_t lr = (uint16_t) local_rank_of[r];
        uint32_t nid = node_of[r];
        PMIX_DATA_ARRAY_CREATE(arr, 5, PMIX_INFO);
        pi = (pmix_info_t *) arr->array;
        PMIX_INFO_LOAD(&pi[0], PMIX_RANK, &r, PMIX_PROC_RANK);
        PMIX_INFO_LOAD(&pi[1], PMIX_APPNUM, &zero, PMIX_UINT32);
        PMIX_INFO_LOAD(&pi[2], PMIX_LOCAL_RANK, &lr, PMIX_UINT16);
        PMIX_INFO_LOAD(&pi[3], PMIX_NODE_RANK, &lr, PMIX_UINT16);
        PMIX_INFO_LOAD(&pi[4], PMIX_NODEID, &nid, PMIX_UINT32);
        PMIX_INFO_LOAD(&info[i++], PMIX_PROC_DATA, arr, PMIX_DATA_ARRAY);
        PMIX_DATA_ARRAY_FREE(arr);
    }
    rc = lp_wait(&w, PMIx_server_register_nspace(nspace, (int) nlocal, info, ninfo, op_done, &w));
    PMIX_INFO_FREE(info, ninfo);
    free(node_map);
    free(proc_map);
    free(peers);
    return rc;
}

/* Register rank `rank` of `nspace` (run as uid:gid) and give its environment: `*env`, a
 * NULL-terminated array of "KEY=VALUE" for lp_free_env. */
int lp_client(const char *nspace, uint32_t rank, uint32_t uid, uint32_t gid, char ***env)
{
    pmix_proc_t proc;
    pmix_status_t rc;
    lp_wait_t w = {1, PMIX_SUCCESS};
    char **e = calloc(1, sizeof(char *));
    if (NULL == e) {
        return PMIX_ERR_NOMEM;
    }
    PMIX_LOAD_PROCID(&proc, nspace, rank);
    rc = lp_wait(&w, PMIx_server_register_client(&proc, uid, gid, NULL, op_done, &w));
    if (PMIX_SUCCESS != rc) {
        free(e);
        return rc;
    }
    rc = PMIx_server_setup_fork(&proc, &e);
    *env = e;
    return rc;
}

void lp_free_env(char **env)
{
    for (size_t n = 0; NULL != env && NULL != env[n]; n++) {
        free(env[n]);
    }
    free(env);
}

static void release(void *cbdata)
{
    free(cbdata);
}

/* Complete a fence: `data` (copied) is every node's contribution; `ok` 0 fails it. */
void lp_fence_done(void *cbfunc, void *cbdata, int ok, const char *data, size_t n)
{
    pmix_modex_cbfunc_t done = (pmix_modex_cbfunc_t) cbfunc;
    char *copy = NULL;
    if (ok && n > 0) {
        copy = malloc(n);
        if (NULL == copy) {
            ok = 0;
        } else {
            memcpy(copy, data, n);
        }
    }
    if (!ok) {
        done(PMIX_ERROR, NULL, 0, cbdata, NULL, NULL);
        return;
    }
    done(PMIX_SUCCESS, copy, n, cbdata, release, copy);
}
