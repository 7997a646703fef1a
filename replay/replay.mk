# The GPU side of 'vramplan replay': build/replay/vp-replay, from
# replay/vp_replay.cu, built with nvcc where it is found (it needs only the
# CUDA runtime and cuBLAS). Included from the Makefile, after NVCC is set:
#
#   include replay/replay.mk
#
#   make replay           build it (or say that nvcc was not found)
#
# REPLAY_ARCH: the targets; by default Hopper machine code (sm_90) and PTX
# that the driver compiles for any other GPU from sm_75 on. The replayer's
# own kernels only fill buffers; the GEMMs are cuBLAS's.

REPLAY_BIN := build/replay/vp-replay
REPLAY_ARCH ?= -gencode arch=compute_90,code=sm_90 \
               -gencode arch=compute_75,code=compute_75

.PHONY: replay

ifeq ($(NVCC),)
replay:
	@echo "nvcc not found, skipped replay"
else
replay: $(REPLAY_BIN)

$(REPLAY_BIN): replay/vp_replay.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(REPLAY_ARCH) -o $@ $< -lcublas
endif
