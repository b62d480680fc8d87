"""The names under which chapter 8's collectives are counted (:func:`lesson_lib.metrics.counters`),
defined once: the layers record under them and the chapter and its checks read them back."""

TP_ALL_REDUCE = "tp_all_reduce"          # f's backward and g's forward (Shoeybi et al., 2019)
SP_ALL_GATHER = "sp_all_gather"          # sequence parallelism: into a parallel region
SP_REDUCE_SCATTER = "sp_reduce_scatter"  # ... and out of it (Korthikanti et al., 2022)
SP_REGATHER = "sp_regather"              # the backward's re-gather of a column layer's input
SP_ENDS = "sp_ends"                      # entering and leaving the sequence-parallel region
SP_NORM_GRADS = "sp_norm_grads"          # the norms' gradients summed across the tp group
PP_ACTIVATION = "pp_activation"          # a stage's output to the next stage
PP_GRADIENT = "pp_gradient"              # its gradient back
DP_GRAD_ALL_REDUCE = "dp_grad_all_reduce"  # a replica's gradients across the dp group
EP_ALL_TO_ALL = "ep_all_to_all"          # mixture of experts: tokens to their experts and back
CP_RING = "cp_ring"                      # ring attention: K and V blocks round the ring
