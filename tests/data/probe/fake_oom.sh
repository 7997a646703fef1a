#!/bin/sh
# Fails for memory the way a framework or library reports it.
# Usage: fake_oom.sh STYLE
case $1 in
torch)  echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB." >&2 ;;
torch-legacy)
        echo "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.76 GiB total capacity; 9.21 GiB already allocated)" >&2 ;;
cuda-error)
        printf 'RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call.\n' >&2 ;;
cublas) echo "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling \`cublasCreate(handle)\`" >&2 ;;
cudnn)  echo "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input." >&2 ;;
runtime) echo "replay.cu:88: cudaMalloc failed: cudaErrorMemoryAllocation (out of memory)" >&2 ;;
driver) echo "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" >&2 ;;
jax)    echo "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes." >&2 ;;
cpu)    echo "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes." >&2 ;;
progress)
        # a progress bar redraws with carriage returns; the error follows on its line
        printf 'epoch 1:  10%%|#   |\repoch 1:  20%%|##  |\rtorch.OutOfMemoryError: CUDA out of memory.\n' >&2 ;;
c10)    echo "terminate called after throwing an instance of 'c10::OutOfMemoryError'" >&2
        kill -ABRT $$ ;;
*)      echo "fake_oom.sh: unknown style '$1'" >&2; exit 2 ;;
esac
exit 1
