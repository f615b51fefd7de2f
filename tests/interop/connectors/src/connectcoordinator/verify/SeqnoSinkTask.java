package connectcoordinator.verify;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

/** Prints what it receives; see SeqnoSinkConnector. */
public class SeqnoSinkTask extends SinkTask {
    private String connector;
    private final List<long[]> unflushed = new ArrayList<>();

    @Override
    public String version() {
        return Lines.VERSION;
    }

    @Override
    public void start(Map<String, String> props) {
        connector = props.get("name");
    }

    @Override
    public void put(Collection<SinkRecord> records) {
        for (SinkRecord record : records) {
            // The key is the source's task number, the value its sequence number.
            int sourceTask = ((Number) record.key()).intValue();
            long seqno = ((Number) record.value()).longValue();
            Lines.print(connector, sourceTask, seqno, null);
            unflushed.add(new long[] {sourceTask, seqno});
        }
    }

    @Override
    public void flush(Map<TopicPartition, OffsetAndMetadata> offsets) {
        for (long[] received : unflushed) {
            Lines.print(connector, (int) received[0], received[1], "flushed");
        }
        unflushed.clear();
    }

    @Override
    public void stop() {
    }
}
