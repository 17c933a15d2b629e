/* A C interface to the engine for code that is built apart from hvdlite._core and
 * must not link against it: hvdlite's TensorFlow kernels, compiled on first use
 * against the installed TensorFlow (hvdlite/tensorflow/kernels). The core fills one
 * table of function pointers; Python hands its address (hvdlite._core.c_api_address())
 * to the other library, which calls the engine through it from any thread, without
 * the GIL. Plain C types only, so the two sides may be built with different C++
 * settings.
 *
 * A request is submitted with `enqueue` (or refused with `refuse`) and returns a
 * handle at once. `when_done` asks for a callback once the handle finished; the
 * callback runs on whichever thread completed it (usually the engine's), so it must
 * be short and must not call back into this table. `take_result` then gives the
 * outcome and any output the engine allocated, and forgets the handle;
 * `free_result` frees the output once it was copied. */
#ifndef HVDLITE_CSRC_C_API_H_
#define HVDLITE_CSRC_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HVDLITE_C_API_VERSION 2

/* Request kinds and element types: the engine's codes (common.h; checked there). */
enum {
  HVDLITE_ALLREDUCE = 0, HVDLITE_ALLGATHER = 1, HVDLITE_BROADCAST = 2, HVDLITE_ALLTOALL = 3,
  HVDLITE_REDUCESCATTER = 4, HVDLITE_BARRIER = 5, HVDLITE_JOIN = 6
};
enum {
  HVDLITE_UINT8 = 0, HVDLITE_INT8 = 1, HVDLITE_INT32 = 2, HVDLITE_INT64 = 3,
  HVDLITE_FLOAT16 = 4, HVDLITE_BFLOAT16 = 5, HVDLITE_FLOAT32 = 6, HVDLITE_FLOAT64 = 7
};

/* One collective on host memory, as hvdlite.common.ops.submit describes it. `input`
 * must stay valid (and `output` writable) until the handle is done. allreduce writes
 * into `output` (which may be `input`); broadcast works in place on `input`;
 * allgather, alltoall and reducescatter outputs are allocated by the engine. */
typedef struct HvdliteRequest {
  int32_t type;
  const char* name;
  int32_t dtype;
  const int64_t* shape;
  int32_t ndim;
  const void* input;
  void* output;
  int32_t reduce_op;
  double prescale;
  double postscale;
  int32_t root;
  const int64_t* splits; /* alltoall: rows for each rank; NULL/0: even split */
  int32_t nsplits;
  int32_t group_id; /* grouped allreduce: shared id and member count; -1/0: none */
  int32_t group_size;
  int32_t process_set; /* Horovod's process set id; 0: the global set. `root` is a rank of the set */
} HvdliteRequest;

/* What a finished handle left. `error` and the output stay valid until free_result. */
typedef struct HvdliteResult {
  int32_t ok;
  int32_t engine_stopped; /* failed because the engine stopped (shut down, a peer died) */
  const char* error;      /* "" when ok */
  const void* data;       /* engine-allocated output (allgather, alltoall, reducescatter) */
  int64_t bytes;
  const int64_t* shape;
  int32_t ndim;
  int32_t dtype;
  const int64_t* aux; /* alltoall: rows received from each rank; join: the last rank */
  int32_t naux;
  void* owner; /* private to the core */
} HvdliteResult;

typedef void (*HvdliteDoneCallback)(void* arg);

typedef struct HvdliteCoreApi {
  int32_t version; /* HVDLITE_C_API_VERSION */
  int32_t struct_size;
  /* The handle (> 0), or 0 when nothing was submitted, the reason copied into `error`
   * (engine not initialized, bad description). A request the engine refuses later
   * (a name in flight, ranks that disagree) gets a handle that fails. */
  int64_t (*enqueue)(const HvdliteRequest* request, char* error, int64_t error_size);
  /* A request this rank cannot take part in (see hvdlite.common.ops.refusal): it
   * fails on every rank with "rank R: <kind> '<name>': <problem>". */
  int64_t (*refuse)(int32_t type, const char* name, const char* problem, int32_t group_id, int32_t group_size,
                    int32_t process_set, char* error, int64_t error_size);
  /* Calls `callback(arg)` once, when `handle` is done (at once if it already is). */
  void (*when_done)(int64_t handle, HvdliteDoneCallback callback, void* arg);
  /* For a done handle: fills `result` and forgets the handle. */
  void (*take_result)(int64_t handle, HvdliteResult* result);
  void (*free_result)(HvdliteResult* result);
  /* The world (-1 when hvdlite is not initialized). */
  int32_t (*rank)(void);
  int32_t (*size)(void);
  /* The number of ranks of a process set (0: the world); -1 when this process has no
   * such set or is not in it. */
  int32_t (*set_size)(int32_t process_set);
} HvdliteCoreApi;

#ifdef __cplusplus
}
#endif

#endif /* HVDLITE_CSRC_C_API_H_ */
