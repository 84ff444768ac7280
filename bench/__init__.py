"""Measurement: the byte meter, the speed-of-light model, devices, the probe, reports.

This package never imports llama_np: the bench runner drives any object that offers the
small decode interface it needs.
"""
