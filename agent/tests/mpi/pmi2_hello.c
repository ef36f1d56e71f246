/* A PMI-2 client through Slurm's libpmi2: every rank puts a key, fences, and reads
 * every other rank's, then prints what it learnt of the job. */
#include <slurm/pmi2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    int spawned, size, rank, appnum, vallen;
    char jobid[256], key[64], want[64], val[PMI2_MAX_VALLEN], mapping[PMI2_MAX_VALLEN];
    int found = 0;
    if (PMI2_Init(&spawned, &size, &rank, &appnum) != PMI2_SUCCESS) {
        fprintf(stderr, "PMI2_Init failed\n");
        return 1;
    }
    if (PMI2_Job_GetId(jobid, sizeof jobid) != PMI2_SUCCESS) return 2;
    if (PMI2_Info_GetJobAttr("PMI_process_mapping", mapping, sizeof mapping, &found) !=
            PMI2_SUCCESS || !found)
        return 3;
    snprintf(key, sizeof key, "card-%d", rank);
    snprintf(val, sizeof val, "from;rank=%d", rank);
    if (PMI2_KVS_Put(key, val) != PMI2_SUCCESS) return 4;
    if (PMI2_KVS_Fence() != PMI2_SUCCESS) return 5;
    for (int r = 0; r < size; r++) {
        snprintf(key, sizeof key, "card-%d", r);
        snprintf(want, sizeof want, "from;rank=%d", r);
        if (PMI2_KVS_Get(jobid, PMI2_ID_NULL, key, val, sizeof val, &vallen) != PMI2_SUCCESS ||
            strcmp(val, want) != 0) {
            fprintf(stderr, "rank %d: %s is %s, not %s\n", rank, key, val, want);
            return 6;
        }
    }
    printf("pmi2 rank=%d size=%d jobid=%s mapping=%s spawned=%d\n", rank, size, jobid,
           mapping, spawned);
    fflush(stdout);
    PMI2_Finalize();
    return 0;
}
