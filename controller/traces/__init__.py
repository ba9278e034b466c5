"""The data spotbag reads rather than keeps: trace files and the reference data it ships.
trace_io.py is the one place that opens a trace (any compression), parses its times and
its CSV or Standard Workload Format rows; price_trace.py reads spot price traces, puts them
on a regular grid and replays them as the local and sim drivers' price source;
vm_size.py gives VM types' vCPUs and memory by name for the tools whose traces name types
only; reference_data.py says where the shipped reference data (lifetimes, a 2015 spot
price trace, an SWF trace) is installed.
"""
