package cec.peers.kstreams;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/** One input value: `{"item_id": 7, "item_price": 412, "item_time": 1234}` (JSON, as cec and Quix read it). */
@JsonIgnoreProperties(ignoreUnknown = true)
final class Purchase {
    @JsonProperty("item_id")
    public long itemId;

    @JsonProperty("item_price")
    public Long itemPrice;

    @JsonProperty("item_time")
    public long itemTime;

    private static final ObjectMapper MAPPER = new ObjectMapper();

    /** The JSON value serde: only deserialization is used (the input is written by the benchmark driver). */
    static Serde<Purchase> serde() {
        Deserializer<Purchase> read = (topic, data) -> {
            if (data == null) {
                return null;
            }
            try {
                return MAPPER.readValue(data, Purchase.class);
            } catch (IOException e) {
                throw new SerializationException("not a purchase: " + e.getMessage(), e);
            }
        };
        Serializer<Purchase> write = (topic, p) -> {
            try {
                return p == null ? null : MAPPER.writeValueAsBytes(p);
            } catch (IOException e) {
                throw new SerializationException(e);
            }
        };
        return Serdes.serdeFrom(write, read);
    }
}
