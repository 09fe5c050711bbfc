package protocol

import (
	"cmp"
	"context"
	"fmt"
	"strings"

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
// Job or Pod hook it names (a list of the namespace's Jobs or Pods for a
// hook named by generateName). What cannot be read is reported as Unknown,
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
		found, err := c.hookObjects(ctx, h)
		if err != nil {
			work.Unknown = fmt.Sprintf("reading its hook %s %s/%s: %v", h.Kind, h.Namespace, cmp.Or(h.Name, h.GenerateName+"*"), err)
			return work
		}
		work.Hooks = append(work.Hooks, found...)
	}
	return work
}

// hookObjects finds the Jobs or Pods hook h created (none for another
// kind, or when they are gone): the one it names, or, for a hook named by
// metadata.generateName, every one whose name the server generated from it
// (a list of the namespace's Jobs or Pods: only on this path, and rare).
func (c *Conn) hookObjects(ctx context.Context, h helmx.HookRef) ([]recovery.HookObject, error) {
	object := func(m metav1.ObjectMeta, finished bool) recovery.HookObject {
		return recovery.HookObject{Kind: h.Kind, Namespace: h.Namespace, Name: m.Name, Created: m.CreationTimestamp.Time, Finished: finished}
	}
	var out []recovery.HookObject
	switch {
	case h.Name == "" && h.GenerateName == "":
		return nil, nil // nothing helm could have created
	case h.Kind == "Job" && h.Name != "":
		j, err := c.client.BatchV1().Jobs(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		if err != nil {
			return nil, ignoreNotFound(err)
		}
		out = append(out, object(j.ObjectMeta, jobFinished(j)))
	case h.Kind == "Pod" && h.Name != "":
		p, err := c.client.CoreV1().Pods(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		if err != nil {
			return nil, ignoreNotFound(err)
		}
		out = append(out, object(p.ObjectMeta, podFinished(p)))
	case h.Kind == "Job":
		l, err := c.client.BatchV1().Jobs(h.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range l.Items {
			if strings.HasPrefix(l.Items[i].Name, h.GenerateName) {
				out = append(out, object(l.Items[i].ObjectMeta, jobFinished(&l.Items[i])))
			}
		}
	case h.Kind == "Pod":
		l, err := c.client.CoreV1().Pods(h.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range l.Items {
			if strings.HasPrefix(l.Items[i].Name, h.GenerateName) {
				out = append(out, object(l.Items[i].ObjectMeta, podFinished(&l.Items[i])))
			}
		}
	}
	return out, nil
}

// ignoreNotFound: a hook object that is gone (deleted, or never created)
// is waited for by nobody.
func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// podFinished reports whether p has ended: succeeded or failed.
func podFinished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
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
