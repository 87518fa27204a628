"""Reading torch.profiler (Kineto) trace files into layerscope profiles."""
