package cec.peers.kstreams;

import java.util.Collection;
import java.util.Map;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.streams.KafkaClientSupplier;

/**
 * Kafka Streams' own clients, except that the main consumer marks "assigned" when the group hands it a
 * partition: a recovery is timed from there, as bench_quix.py times Quix's (the group's rejoin excluded).
 */
final class MarkingClientSupplier implements KafkaClientSupplier {
    private final Marks marks;

    MarkingClientSupplier(Marks marks) {
        this.marks = marks;
    }

    @Override
    public Admin getAdmin(Map<String, Object> config) {
        return Admin.create(config);
    }

    @Override
    public Producer<byte[], byte[]> getProducer(Map<String, Object> config) {
        return new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer());
    }

    @Override
    public Consumer<byte[], byte[]> getConsumer(Map<String, Object> config) {
        return new MarkingConsumer(config, marks);
    }

    @Override
    public Consumer<byte[], byte[]> getRestoreConsumer(Map<String, Object> config) {
        return new KafkaConsumer<>(config, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    @Override
    public Consumer<byte[], byte[]> getGlobalConsumer(Map<String, Object> config) {
        return new KafkaConsumer<>(config, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    private static final class MarkingConsumer extends KafkaConsumer<byte[], byte[]> {
        private final Marks marks;

        MarkingConsumer(Map<String, Object> config, Marks marks) {
            super(config, new ByteArrayDeserializer(), new ByteArrayDeserializer());
            this.marks = marks;
        }

        @Override
        public void subscribe(Collection<String> topics, ConsumerRebalanceListener listener) {
            super.subscribe(topics, new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    if (!partitions.isEmpty()) {
                        marks.first("assigned");
                    }
                    listener.onPartitionsAssigned(partitions);
                }

                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                    listener.onPartitionsRevoked(partitions);
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> partitions) {
                    listener.onPartitionsLost(partitions);
                }
            });
        }
    }
}
