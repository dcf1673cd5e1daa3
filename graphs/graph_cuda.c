/* CUDA graph capture and replay: see graph_cuda.h. */
#include "graph_cuda.h"

cudaError_t gdn__graph_capture_begin(cudaStream_t capture_stream)
{
    return cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal);
}

cudaError_t gdn__graph_capture_end(cudaStream_t capture_stream, int keep, cudaGraphExec_t *exec, cudaGraph_t *graph)
{
    *exec = NULL;
    *graph = NULL;
    cudaError_t err = cudaStreamEndCapture(capture_stream, graph);
    if (err == cudaSuccess && keep) err = cudaGraphInstantiate(exec, *graph, 0);
    if (err != cudaSuccess || !keep) {
        gdn__graph_destroy(*exec, *graph);
        *exec = NULL;
        *graph = NULL;
    }
    return err;
}

cudaError_t gdn__graph_launch(cudaGraphExec_t exec, cudaStream_t stream) { return cudaGraphLaunch(exec, stream); }

void gdn__graph_destroy(cudaGraphExec_t exec, cudaGraph_t graph)
{
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
}
