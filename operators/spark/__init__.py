"""Hosting CEC operators on PySpark.

- one operator instance per partition runs `operators.job.run_job` with an instance spec (pure Python,
  no Spark import: also what a failure-free reference run uses);
- `operators.spark.host`: long-running operator tasks on Spark (`SparkOperatorHost`), relaunched by Spark
  when they die, each new attempt recovering from its own output log;
- `operators.spark.datasource`: the "cec-kafka" Python Data Source (batch and streaming reader, sink);
- `operators.spark.session`: a local SparkSession configured for all of the above.

Submodules are imported explicitly so that `import operators.spark` never starts or requires Spark.
"""

__all__: list[str] = []
