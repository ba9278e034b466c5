"""What things cost, computed and shown one way: cost reports of a bag or an account by the
split-cost allocation (report.py; as CSV or one HTML page, report_render.py), each bag's and
the whole fleet's cost as the API's views show them, priced by the reports' own rule and
kept and refreshed off the event loop (bag_cost.py, fleet_cost.py; shared_result.py lets
many requests await one computation), and the views of bags, jobs and VMs that carry those
figures to the API and `spotbag simulate` (summary.py). The routes that serve them are in
controller/api/, the terminal tables in controller/cli/, the offline prepaid and split-cost
tools in controller/tools/.
"""
