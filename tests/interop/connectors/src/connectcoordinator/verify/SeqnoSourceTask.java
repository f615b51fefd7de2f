package connectcoordinator.verify;

import java.util.Collections;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.source.SourceTask;

/** One numbered series of records; see SeqnoSourceConnector. */
public class SeqnoSourceTask extends SourceTask {
    private String connector;
    private String topic;
    private int task;
    private long pauseMs;
    private Map<String, Integer> partition;
    private long next;
    private long dueAt;

    @Override
    public String version() {
        return Lines.VERSION;
    }

    @Override
    public void start(Map<String, String> props) {
        connector = props.get("name");
        topic = props.get("topic");
        task = Integer.parseInt(props.get(Lines.TASK_NUMBER));
        long throughput = Long.parseLong(props.getOrDefault("throughput", "10"));
        pauseMs = throughput > 0 ? Math.max(1L, 1000L / throughput) : 0L;
        partition = Collections.singletonMap("task", task);
        // Resume after the last number whose offset was committed: a record may be written
        // twice across a restart, never skipped.
        Map<String, Object> committed = context.offsetStorageReader().offset(partition);
        next = committed == null ? 0L : ((Number) committed.get("seqno")).longValue() + 1;
        dueAt = System.currentTimeMillis();
    }

    @Override
    public List<SourceRecord> poll() throws InterruptedException {
        long wait = dueAt - System.currentTimeMillis();
        if (wait > 0) {
            Thread.sleep(wait);
        }
        dueAt = Math.max(dueAt + pauseMs, System.currentTimeMillis() - 1000L);
        long seqno = next++;
        SourceRecord record = new SourceRecord(partition, Collections.singletonMap("seqno", seqno),
                topic, null, Schema.INT32_SCHEMA, task, Schema.INT64_SCHEMA, seqno);
        Lines.print(connector, task, seqno, null);
        return Collections.singletonList(record);
    }

    @Override
    public void commitRecord(SourceRecord record, RecordMetadata metadata) {
        Lines.print(connector, task, (Long) record.value(), "committed");
    }

    @Override
    public void stop() {
    }
}
