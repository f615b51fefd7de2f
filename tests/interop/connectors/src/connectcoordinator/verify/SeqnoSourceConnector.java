package connectcoordinator.verify;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.source.SourceConnector;

/**
 * A source whose tasks each write their own numbered records to one topic: task T writes
 * key T and values 0, 1, 2, ... at `throughput` records a second, resuming after the last
 * number whose offset Connect committed. Each task prints a JSON line per record it hands
 * to Connect and one (marked "committed") per record the broker acknowledged.
 */
public class SeqnoSourceConnector extends SourceConnector {
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
        return SeqnoSourceTask.class;
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
        return new ConfigDef()
            .define("topic", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH,
                    "The topic the tasks write to.")
            .define("throughput", ConfigDef.Type.LONG, 10L, ConfigDef.Importance.LOW,
                    "Records a second per task.");
    }
}
