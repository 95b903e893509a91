"""The conventions of vision-language model families, as the sink lays a batch's media out for them: one
module per family (``qwen2_vl``: Qwen2-VL's pixel patches, grids and M-RoPE positions). Another family is
a module beside it."""
