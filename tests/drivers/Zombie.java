// The zombie scenario with pgjdbc, declaring tokens its idiomatic ways: SET statements and the
// `options` connection property. Usage: java -cp postgresql.jar Zombie.java HOST PORT. Prints
// one JSON object per case.
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;

public class Zombie {
    static String url;

    interface Body { void run() throws SQLException; }

    static void report(String name, Body body) {
        try {
            body.run();
            System.out.println("{\"case\": \"" + name + "\", \"ok\": true}");
        } catch (SQLException e) {
            String msg = String.valueOf(e.getMessage()).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ");
            System.out.println("{\"case\": \"" + name + "\", \"ok\": false, \"sqlstate\": \""
                + e.getSQLState() + "\", \"message\": \"" + msg + "\"}");
        }
        System.out.flush();
    }

    static Connection bySet(int token) throws SQLException {
        Connection c = DriverManager.getConnection(url);
        try (Statement s = c.createStatement()) {
            s.execute("SET fencing.resource = 'acct:1'");
            s.execute("SET fencing.token = '" + token + "'");
        }
        return c;
    }

    static Connection byOptions(int token) throws SQLException {
        String o = "-c fencing.resource=acct:1 -c fencing.token=" + token;
        return DriverManager.getConnection(url + "&options=" + URLEncoder.encode(o, StandardCharsets.UTF_8));
    }

    static void update(Connection c, String owner) throws SQLException {
        try (PreparedStatement p = c.prepareStatement("UPDATE acct SET owner = ? WHERE id = 1")) {
            p.setString(1, owner);
            p.executeUpdate();
        }
    }

    public static void main(String[] args) throws Exception {
        url = "jdbc:postgresql://" + args[0] + ":" + args[1] + "/postgres?user=postgres&sslmode=disable";
        Connection a = bySet(41);
        a.setAutoCommit(false);
        update(a, "A");
        Connection b = byOptions(42);
        report("newer_write", () -> update(b, "B"));
        report("zombie_commit", a::commit);
        Connection c = bySet(41);
        report("stale_autocommit", () -> update(c, "C"));
        Connection d = byOptions(42);
        report("current_write", () -> update(d, "D"));
    }
}
