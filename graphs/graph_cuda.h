/*
 * CUDA graph capture, instantiation, replay and destruction for the CUDA backend. Host C over the
 * CUDA runtime; the engine reaches these through the backend interface (engine/backend_impl.h).
 */
#ifndef GDN_GRAPHS_GRAPH_CUDA_H
#define GDN_GRAPHS_GRAPH_CUDA_H

#include <cuda_runtime.h>

/* Starts capturing everything enqueued on `capture_stream` (thread-local capture mode, so other
 * threads' CUDA calls are not disturbed). */
cudaError_t gdn__graph_capture_begin(cudaStream_t capture_stream);

/* Ends the capture and, when keep is nonzero and the capture is valid, instantiates it into *exec
 * and keeps the captured graph in *graph (its nodes name what an update of *exec changes);
 * otherwise discards both and leaves them NULL. */
cudaError_t gdn__graph_capture_end(cudaStream_t capture_stream, int keep, cudaGraphExec_t *exec, cudaGraph_t *graph);

/* Replays an instantiated graph on `stream` (no host synchronisation). */
cudaError_t gdn__graph_launch(cudaGraphExec_t exec, cudaStream_t stream);

/* Frees an instantiated graph and its captured graph; NULLs are no-ops. */
void gdn__graph_destroy(cudaGraphExec_t exec, cudaGraph_t graph);

#endif /* GDN_GRAPHS_GRAPH_CUDA_H */
