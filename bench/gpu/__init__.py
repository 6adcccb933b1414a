"""A lent GPU: the prepared check (`gpu_check`, whose pieces `gpu_decoders`, `gpu_measures`, `gpu_learning`,
`gpu_profile` and `gpu_report` it imports by module name from this folder), what the bare device needs carried
(`gpu_carry`), and a GPU-sized GRPO step (`gpu_step`)."""
