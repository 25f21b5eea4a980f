# Everything a fresh machine needs is installed by these targets (Python >= 3.10; Java 17 for Spark).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# Apache Kafka's broker jars (tests/brokers.py starts a one-node KRaft broker from them): resolved from Maven
# Central by tools/kafka/pom.xml, whose kafka.version is the one source of the version. Without Maven the
# target says so and the tests fall back to Tansu (tests/brokers.py says which broker a run used).
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' tools/kafka/pom.xml)
KAFKA_LIBS := .cache/kafka/$(KAFKA_VERSION)/libs
KAFKA_STAMP := $(KAFKA_LIBS)/.complete

# Spark's Kafka connector (spark-sql-kafka-0-10, the `kafka` source and sink of Structured Streaming), which
# PySpark from PyPI does not ship: resolved from Maven Central by tools/spark-kafka/pom.xml at the pinned
# PySpark's version; operators.spark.connector puts these jars on a session's classpath (spark.jars).
# Without Maven the target says so: the benchmarks' Spark native baseline then cannot run, and cec_aggregate
# reads its input through its Python data source.
SPARK_VERSION := $(shell sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' tools/spark-kafka/pom.xml)
SPARK_KAFKA_LIBS := .cache/spark-kafka/$(SPARK_VERSION)/libs
SPARK_KAFKA_STAMP := $(SPARK_KAFKA_LIBS)/.complete

.PHONY: setup bytecode demo test lint bench clean kafka-jars spark-kafka-jars spark-cds kstreams-peer

$(STAMP): pyproject.toml setup.py cec/_native.c
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test,bench,spark]'
	touch $(STAMP)

setup: $(STAMP)

# The packages' bytecode, as an installed package has it: where the environment says PYTHONDONTWRITEBYTECODE
# (CI machines' shells do), every `cec` process, operator worker and Spark Python worker would compile ~150
# modules again (measured: tests/cec/test_cli.py 193 -> 139 CPU seconds with it). Only what changed is compiled.
bytecode: $(STAMP)
	$(VENV)/bin/python -m compileall -q -j 0 cec operators queuestore recovery tests benchmarks >/dev/null

$(KAFKA_STAMP): tools/kafka/pom.xml
	@if command -v mvn >/dev/null 2>&1; then \
		rm -rf $(KAFKA_LIBS) && \
		mvn -q -B -Dstyle.color=never -f tools/kafka/pom.xml dependency:copy-dependencies \
			-DoutputDirectory=$(CURDIR)/$(KAFKA_LIBS) && \
		touch $@; \
	else \
		echo "kafka-jars: no mvn on PATH: the Kafka tests will run on Tansu instead of Apache Kafka"; \
	fi

kafka-jars: $(KAFKA_STAMP)

$(SPARK_KAFKA_STAMP): tools/spark-kafka/pom.xml
	@if command -v mvn >/dev/null 2>&1; then \
		rm -rf $(SPARK_KAFKA_LIBS) && \
		mvn -q -B -Dstyle.color=never -f tools/spark-kafka/pom.xml dependency:copy-dependencies \
			-DoutputDirectory=$(CURDIR)/$(SPARK_KAFKA_LIBS) && \
		touch $@; \
	else \
		echo "spark-kafka-jars: no mvn on PATH: Spark sessions run without Spark's Kafka connector"; \
	fi

spark-kafka-jars: $(SPARK_KAFKA_STAMP)

# The class-data-sharing archive the tests' Spark drivers map (tests/spark_cds.py): dumped by one small
# driver run, again whenever the venv or the connector's jars change (the JVM refuses a stale archive and
# runs without it). Without it the tests run the same, their drivers only start slower.
SPARK_CDS := .cache/spark-cds/spark.jsa

$(SPARK_CDS): $(STAMP) tests/spark_cds.py $(wildcard $(SPARK_KAFKA_STAMP)) | spark-kafka-jars
	$(VENV)/bin/python -m tests.spark_cds $@

spark-cds: $(SPARK_CDS)

# The Kafka Streams peer of benchmarks/bench_kafka_streams.py (JDK 17 + Maven; its jars from Maven Central):
# benchmarks/peers/kafka-streams/target/kstreams-peer.jar and target/lib/.
kstreams-peer:
	mvn -q -B -Dstyle.color=never -f benchmarks/peers/kafka-streams/pom.xml package

demo: $(STAMP) bytecode
	$(VENV)/bin/cec demo

# Two workers, each given whole files (module fixtures built once), in the order tests/conftest.py sets:
# the longest files first (LONGEST_FILES), not pytest-xdist's default order by number of tests, which left
# the long Spark crash files, a few tests each, for the end of the run.
test: $(STAMP) bytecode kafka-jars spark-kafka-jars spark-cds
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=20 -n 2 --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP) bytecode kafka-jars spark-kafka-jars
	$(VENV)/bin/python benchmarks/bench_recovery.py

clean:
	rm -rf $(VENV) .cache build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
