package protocol

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// lookForWork gathers the signs that a helm process is still at work on
// the legacy pending revision target (recovery.Decide, rule 5): the hook
// Jobs and Pods its own record names, as they stand in the cluster. helm
// waits for a Job or Pod hook to finish; hooks of other kinds are done once
// created. It runs only when a decision asks for it (LookForWork), so it
// costs nothing on any other path: one read of the record, and one of each
// Job or Pod hook it names. What cannot be read is reported as Unknown,
// and the revision waits.
func (c *Conn) lookForWork(ctx context.Context, ns string, target helmx.Summary) recovery.Work {
	work := recovery.Work{Looked: true}
	if c.recordsErr != nil {
		work.Unknown = c.recordsErr.Error()
		return work
	}
	r, err := c.records.Get(ctx, ns, target.RecordName)
	if err != nil {
		work.Unknown = fmt.Sprintf("reading revision %d's %s %s: %v", target.Revision, c.records.Kind(), target.RecordName, err)
		return work
	}
	hooks, err := helmx.ReleaseHooks(r, target.Namespace)
	if err != nil {
		work.Unknown = err.Error()
		return work
	}
	for _, h := range hooks {
		var obj metav1.Object
		var finished bool
		switch h.Kind {
		case "Job":
			j, gerr := c.client.BatchV1().Jobs(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
			obj, finished, err = j, jobFinished(j), gerr
		case "Pod":
			p, gerr := c.client.CoreV1().Pods(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
			obj, finished, err = p, gerr == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed), gerr
		default:
			continue
		}
		switch {
		case apierrors.IsNotFound(err):
			continue // deleted, or never created: nobody waits for it
		case err != nil:
			work.Unknown = fmt.Sprintf("reading its hook %s %s/%s: %v", h.Kind, h.Namespace, h.Name, err)
			return work
		}
		work.Hooks = append(work.Hooks, recovery.HookObject{
			Kind: h.Kind, Namespace: h.Namespace, Name: h.Name,
			Created: obj.GetCreationTimestamp().Time, Finished: finished,
		})
	}
	return work
}

// jobFinished reports whether j has ended, as helm's wait for a hook Job
// sees it: complete or failed.
func jobFinished(j *batchv1.Job) bool {
	if j == nil {
		return false
	}
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
