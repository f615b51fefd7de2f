package connectcoordinator.verify;

/** The one JSON line per record that the tests read from a worker's standard output. */
final class Lines {
    static final String VERSION = "1";
    static final String TASK_NUMBER = "seqno.task";

    private Lines() {
    }

    static void print(String connector, int task, long seqno, String mark) {
        StringBuilder line = new StringBuilder("{\"name\":\"")
            .append(connector.replace("\\", "\\\\").replace("\"", "\\\""))
            .append("\",\"task\":").append(task)
            .append(",\"seqno\":").append(seqno)
            .append(",\"time_ms\":").append(System.currentTimeMillis());
        if (mark != null) {
            line.append(",\"").append(mark).append("\":true");
        }
        line.append('}');
        // One write per line, flushed: lines of tasks on other threads never interleave,
        // and a worker killed at any moment leaves whole lines.
        synchronized (System.out) {
            System.out.println(line);
            System.out.flush();
        }
    }
}
