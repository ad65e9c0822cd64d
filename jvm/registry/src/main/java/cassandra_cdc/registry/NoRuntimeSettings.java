package cassandra_cdc.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.inject.Produces;
import javax.inject.Singleton;

/**
 * The list of the registry's settings that can be changed while it runs, which the build step missing from
 * Maven Central would make: empty, so every setting keeps the value it started with.
 */
public class NoRuntimeSettings {
    @Produces
    @Singleton
    DynamicConfigPropertyList runtimeSettings() {
        return new DynamicConfigPropertyList(List.of());
    }
}
