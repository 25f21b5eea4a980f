package cec.peers.kstreams;

import java.nio.ByteBuffer;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;

/** The state of one open window: how many prices it holds and their sum (12 bytes in the store). */
final class CountSum {
    final int count;
    final double sum;

    CountSum(int count, double sum) {
        this.count = count;
        this.sum = sum;
    }

    static final CountSum EMPTY = new CountSum(0, 0.0);

    CountSum add(double price) {
        return new CountSum(count + 1, sum + price);
    }

    double average() {
        return sum / count;
    }

    static Serde<CountSum> serde() {
        return Serdes.serdeFrom(
                (topic, cs) -> cs == null ? null : ByteBuffer.allocate(12).putInt(cs.count).putDouble(cs.sum).array(),
                (topic, data) -> {
                    if (data == null) {
                        return null;
                    }
                    if (data.length != 12) {
                        throw new SerializationException("a count/sum state is 12 bytes, got " + data.length);
                    }
                    ByteBuffer b = ByteBuffer.wrap(data);
                    return new CountSum(b.getInt(), b.getDouble());
                });
    }
}
