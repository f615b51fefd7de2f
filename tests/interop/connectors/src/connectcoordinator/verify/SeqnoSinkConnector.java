package connectcoordinator.verify;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.sink.SinkConnector;

/**
 * A sink that prints a JSON line per record it receives from a SeqnoSourceConnector's
 * topic (the source's task number and sequence number), and one marked "flushed" per
 * record once Connect flushes its offsets.
 */
public class SeqnoSinkConnector extends SinkConnector {
    private Map<String, String> settings;

    @Override
    public String version() {
        return Lines.VERSION;
    }

    @Override
    public void start(Map<String, String> props) {
        settings = new HashMap<>(props);
    }

    @Override
    public Class<? extends Task> taskClass() {
        return SeqnoSinkTask.class;
    }

    @Override
    public List<Map<String, String>> taskConfigs(int maxTasks) {
        List<Map<String, String>> configs = new ArrayList<>();
        for (int task = 0; task < maxTasks; task++) {
            Map<String, String> config = new HashMap<>(settings);
            config.put(Lines.TASK_NUMBER, Integer.toString(task));
            configs.add(config);
        }
        return configs;
    }

    @Override
    public void stop() {
    }

    @Override
    public ConfigDef config() {
        return new ConfigDef();
    }
}
