import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Map;

import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;

/**
 * Kafka Connect's JsonConverter (schemas enabled) reading messages and writing them back: one base64
 * message a line on stdin, per line the base64 of what the converter writes on stdout, or "ERROR " and
 * the converter's message when it rejects the input.
 */
public class JsonConverterRoundTrip {
    public static void main(String[] args) throws Exception {
        JsonConverter converter = new JsonConverter();
        converter.configure(Map.of("schemas.enable", "true"), false);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            try {
                SchemaAndValue read = converter.toConnectData("events", Base64.getDecoder().decode(line));
                byte[] written = converter.fromConnectData("events", read.schema(), read.value());
                System.out.println(Base64.getEncoder().encodeToString(written));
            } catch (RuntimeException error) {
                System.out.println(("ERROR " + error).replace('\n', ' '));
            }
        }
    }
}
