package io.qclient.peer;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/** Flags of one subcommand: {@code --name value} pairs; a flag in {@code repeated} may recur. */
final class Args {
    private final Map<String, List<String>> values = new HashMap<>();

    Args(String[] argv, int from, Set<String> known, Set<String> repeated) {
        for (int i = from; i < argv.length; i++) {
            String a = argv[i];
            if (!a.startsWith("--")) {
                throw new IllegalArgumentException("expected --flag, got " + a);
            }
            String name = a.substring(2);
            String value;
            int eq = name.indexOf('=');
            if (eq > 0 && !repeated.contains(name.substring(0, eq))) {
                value = name.substring(eq + 1);
                name = name.substring(0, eq);
            } else {
                if (i + 1 >= argv.length) {
                    throw new IllegalArgumentException("--" + name + " needs a value");
                }
                value = argv[++i];
            }
            if (!known.contains(name)) {
                throw new IllegalArgumentException("unknown flag --" + name + "; known: " + known);
            }
            List<String> list = values.computeIfAbsent(name, k -> new ArrayList<>());
            if (!list.isEmpty() && !repeated.contains(name)) {
                throw new IllegalArgumentException("--" + name + " given twice");
            }
            list.add(value);
        }
    }

    String str(String name, String dflt) {
        List<String> v = values.get(name);
        return v == null ? dflt : v.get(0);
    }

    String required(String name) {
        String v = str(name, null);
        if (v == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return v;
    }

    long num(String name, long dflt) {
        String v = str(name, null);
        return v == null ? dflt : Long.parseLong(v);
    }

    int integer(String name, int dflt) {
        return Math.toIntExact(num(name, dflt));
    }

    boolean has(String name) {
        return values.containsKey(name);
    }

    Boolean bool(String name) {
        String v = str(name, null);
        if (v == null) {
            return null;
        }
        if (!v.equals("true") && !v.equals("false")) {
            throw new IllegalArgumentException("--" + name + " takes true or false, got " + v);
        }
        return Boolean.valueOf(v);
    }

    /** Every {@code --name k=v}, in order. */
    Map<String, String> pairs(String name) {
        Map<String, String> out = new LinkedHashMap<>();
        for (String kv : values.getOrDefault(name, List.of())) {
            int eq = kv.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("--" + name + " takes k=v, got " + kv);
            }
            out.put(kv.substring(0, eq), kv.substring(eq + 1));
        }
        return out;
    }
}
