"""Capacity report and metrics recorder for the coordinator.

``recorder`` samples the Prometheus endpoint (or reads a Prometheus server) into Parquet;
``job`` turns that Parquet plus a group snapshot into an HTML/CSV/JSON capacity report with
PySpark. The small math lives in ``figures`` so it can be tested without Spark.
"""
