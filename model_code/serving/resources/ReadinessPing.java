package io.d2ops.serving;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.pytorch.serve.servingsdk.Context;
import org.pytorch.serve.servingsdk.Model;
import org.pytorch.serve.servingsdk.ModelServerEndpoint;
import org.pytorch.serve.servingsdk.Worker;
import org.pytorch.serve.servingsdk.annotations.Endpoint;
import org.pytorch.serve.servingsdk.annotations.helpers.EndpointTypes;
import org.pytorch.serve.servingsdk.http.Request;
import org.pytorch.serve.servingsdk.http.Response;

/**
 * Replaces TorchServe's /ping, which in 0.12 answers 200 while workers are still loading the
 * model (it only checks that no worker has been failing for too long, and answers 200 when no
 * model is registered at all). SageMaker routes traffic as soon as /ping answers 200, so this one
 * answers 200 only when a model is registered and every model has a worker that finished
 * loading: the handler's initialize(), warm-up included, has returned.
 */
@Endpoint(
        urlPattern = "ping",
        endpointType = EndpointTypes.INFERENCE,
        description = "200 once the model is loaded and warmed up, 503 before")
public class ReadinessPing extends ModelServerEndpoint {

    @Override
    public void doGet(Request req, Response rsp, Context ctx) throws IOException {
        Map<String, Model> models = ctx.getModels();
        String reason = null;
        if (models == null || models.isEmpty()) {
            reason = "no model is registered";
        } else {
            for (Model model : models.values()) {
                boolean ready = false;
                for (Worker worker : model.getModelWorkers()) {
                    ready = ready || worker.isRunning();
                }
                if (!ready) {
                    reason = "model " + model.getModelName() + " is still loading (no worker ready)";
                    break;
                }
            }
        }
        String body =
                reason == null
                        ? "{\"status\": \"Healthy\"}\n"
                        : "{\"status\": \"Unhealthy\", \"reason\": \"" + reason + "\"}\n";
        rsp.setStatus(reason == null ? 200 : 503);
        rsp.setContentType("application/json");
        rsp.getOutputStream().write(body.getBytes(StandardCharsets.UTF_8));
    }
}
